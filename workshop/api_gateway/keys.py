"""The gateway's API keys, from a JSON or TOML file.

```json
{"keys": [{"name": "team-a", "key": "sk-...", "requests_per_minute": 60, "burst": 10,
           "quota_tokens": 100000, "quota_window_s": 3600, "admin": false}]}
```

``name`` is what logs and ``/gateway/stats`` show; the secret itself is kept only as its
SHA-256 digest, so no log line, stats answer or error message can contain it. ``admin``
keys may read ``/gateway/stats``. A key without ``quota_tokens`` has no token quota.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class KeySpec:
    name: str
    digest: str                         # sha256 of the secret, hex
    requests_per_minute: float
    burst: int
    quota_tokens: int | None = None
    quota_window_s: float = 3600.0
    admin: bool = False


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer_secret(authorization: str | None) -> str | None:
    """The key in an ``Authorization: Bearer KEY`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def parse_keys(entries: Iterable[dict[str, Any]]) -> dict[str, KeySpec]:
    """``{digest: KeySpec}``; refuses duplicate names or secrets and missing fields."""
    out: dict[str, KeySpec] = {}
    names: set[str] = set()
    for i, e in enumerate(entries):
        missing = {"name", "key", "requests_per_minute"} - set(e)
        if missing:
            raise ValueError(f"key #{i} lacks {sorted(missing)}")
        spec = KeySpec(name=str(e["name"]), digest=digest(str(e["key"])),
                       requests_per_minute=float(e["requests_per_minute"]),
                       burst=int(e.get("burst", max(1, int(e["requests_per_minute"] // 6)))),
                       quota_tokens=None if e.get("quota_tokens") is None
                       else int(e["quota_tokens"]),
                       quota_window_s=float(e.get("quota_window_s", 3600.0)),
                       admin=bool(e.get("admin", False)))
        if spec.name in names or spec.digest in out:
            raise ValueError(f"key #{i} ({spec.name}) repeats a name or a secret")
        names.add(spec.name)
        out[spec.digest] = spec
    if not out:
        raise ValueError("no keys")
    return out


def load_keys(path: str | Path) -> dict[str, KeySpec]:
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:                         # Python 3.10
            import tomli as tomllib
        data = tomllib.loads(text)
    else:
        data = json.loads(text)
    return parse_keys(data["keys"])
