"""Workloads: reproducible by seed, the advertised shapes, the prefix-reuse arithmetic."""

import asyncio
import json

import pytest

from workshop.bench.workloads import (
    Reply,
    Request,
    Tokenizer,
    build_workload,
    describe,
    iter_json_array,
    plan,
    prefix_reuse_ratio,
    sharegpt_conversations,
)


@pytest.fixture(scope="module")
def tok():
    # The bundled tokenizer when prepared; otherwise the whitespace stand-in still exercises the
    # logic.
    try:
        return Tokenizer.load("smollm2-135m")
    except Exception:
        return Tokenizer()


def _requests(w):
    return [(s.request.messages, s.request.prompt, s.request.max_tokens, s.request.tag)
            for s in plan(w)]


@pytest.mark.parametrize("name", ["random", "shared-prefix", "agentic"])
def test_same_seed_same_requests_other_seed_different(tok, name):
    a = _requests(build_workload(name, tok, num_requests=12, seed=1))
    b = _requests(build_workload(name, tok, num_requests=12, seed=1))
    c = _requests(build_workload(name, tok, num_requests=12, seed=2))
    assert a == b
    assert a != c


def test_random_lengths_are_exact(tok):
    if tok.hf is None:
        pytest.skip("needs the model tokenizer")
    w = build_workload("random", tok, num_requests=5, seed=0, input_len=100, output_len=7)
    sent = plan(w)
    assert [len(tok.prompt_ids(s.request)) for s in sent] == [100] * 5
    assert all(s.request.max_tokens == 7 and s.request.api == "completions" for s in sent)
    assert describe(w)["prefix_reuse_ratio"] < 0.05


def test_shared_prefix_groups(tok):
    w = build_workload("shared-prefix", tok, num_requests=12, seed=0, num_groups=3,
                       system_prompt_len=200,
                       question_len=20, output_len=5)
    sent = plan(w)
    systems = {s.request.messages[0]["content"] for s in sent}
    assert len(systems) == 3
    assert sorted(s.request.tag for s in sent) == sorted([f"group-{g}" for g in range(3)] * 4)
    # each group's first request pays its system prompt; the other 9 reuse ~200 of ~230 tokens
    assert 0.55 < describe(w)["prefix_reuse_ratio"] < 0.85


def test_agentic_structure(tok):
    w = build_workload("agentic", tok, num_sessions=2, seed=0, main_turns=3, fork_at=[1],
                       branches=3,
                       branch_turns=2)
    sent = plan(w)
    per = 3 + 3 * (2 + 1) + 2
    assert len(sent) == 2 * per == sum(s.expected_requests() for s in w.sessions)
    tags = [s.request.tag for s in sent[:per]]
    assert tags[:2] == ["main0-0", "main1-0"]
    assert tags[-2:] == ["propose", "review"]
    assert sum(t.endswith("-summary") for t in tags) == 3
    first = sent[0].request.messages
    # one system prompt for every session, with the tool schemas in it
    assert all(s.request.messages[0] == first[0] for s in sent)
    assert '"name": "read_file"' in first[0]["content"]
    # a branch inherits the whole main history up to the fork, replies included
    branch = next(s for s in sent if s.request.tag == "fork1-branch0-0")
    main2 = next(s for s in sent if s.request.tag == "main1-0")
    assert branch.request.messages[:len(main2.request.messages)] == main2.request.messages
    assert branch.request.messages[len(main2.request.messages)]["content"] == main2.reply
    # the final review sees the proposal
    review = sent[per - 1].request.messages
    assert review[-2]["role"] == "assistant" and review[-2]["content"] == sent[per - 2].reply
    assert "rate it from 1 to 10" in review[-1]["content"]
    assert describe(w)["prefix_reuse_ratio"] > 0.7


def test_agentic_uses_real_replies_and_stops_a_failed_thread(tok):
    w = build_workload("agentic", tok, num_sessions=1, seed=0, main_turns=2, fork_at=[], branches=0)
    seen = []

    async def send(req: Request) -> Reply:
        seen.append(req)
        if len(seen) == 2:
            return Reply("", ok=False)
        return Reply(f"REPLY{len(seen)}")

    asyncio.run(w.sessions[0].run(send))
    assert len(seen) == 2  # nothing depends on a failed reply
    assert seen[1].messages[2] == {"role": "assistant", "content": "REPLY1"}


def test_a_tool_call_cut_short_goes_back_as_text(tok):
    """Its arguments are not JSON (the budget ended inside them): sent back as a call, a server
    refuses the next request (ours does, with a 400)."""
    w = build_workload("agentic", tok, num_sessions=1, seed=0, main_turns=3, fork_at=[],
                       branches=0, tool_calls=True, num_tools=1)
    whole = {"id": "c1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
    cut = {"id": "c2", "type": "function",
           "function": {"name": "read_file", "arguments": '{"path": "a very long na'}}
    replies = iter([Reply("", tool_calls=[whole]), Reply("", tool_calls=[cut])])
    seen = []

    async def send(req: Request) -> Reply:
        seen.append(req)
        return next(replies, Reply("done"))

    asyncio.run(w.sessions[0].run(send))
    after_whole, after_cut = seen[1].messages, seen[2].messages
    assert after_whole[-2] == {"role": "assistant", "content": None, "tool_calls": [whole]}
    assert after_whole[-1]["role"] == "tool" and after_whole[-1]["tool_call_id"] == "c1"
    assert after_cut[-2] == {"role": "assistant", "content": 'read_file{"path": "a very long na'}
    assert not any(m.get("tool_calls") == [cut] for m in after_cut)


def test_agentic_num_tools_shortens_the_system_prompt_and_calls_only_those_tools(tok):
    kw = dict(num_sessions=1, seed=0, main_turns=4, fork_at=[], branches=0, system_prompt_len=0)
    full, one = (plan(build_workload("agentic", tok, num_tools=n, **kw)) for n in (None, 1))
    assert '"name": "list_dir"' in full[0].request.messages[0]["content"]
    system = one[0].request.messages[0]["content"]
    assert '"name": "read_file"' in system and '"name": "list_dir"' not in system
    assert tok.count(system) < tok.count(full[0].request.messages[0]["content"]) / 2
    results = [m["content"] for m in one[-1].request.messages
               if m["content"].startswith("Tool result (")]
    assert len(results) == 4 and all(r.startswith("Tool result (read_file)") for r in results)


def test_prefix_reuse_ratio_by_hand():
    # second prompt shares 2 tokens with the first prompt
    assert prefix_reuse_ratio([([1, 2, 3], []), ([1, 2, 9, 9], [])]) == pytest.approx(2 / 7)
    # replies count: the next turn's prompt extends prompt + reply
    assert prefix_reuse_ratio([([1, 2], [3, 4]), ([1, 2, 3, 4, 5], [])]) == pytest.approx(4 / 7)
    assert prefix_reuse_ratio([([1], []), ([2], [])]) == 0.0
    assert prefix_reuse_ratio([]) == 0.0


def test_prefix_reuse_ratio_in_whole_blocks():
    # 5 tokens in common with the first prompt: blocks of 2 reuse 4 of them, blocks of 8 none
    seqs = [([1, 2, 3, 4, 5, 6], []), ([1, 2, 3, 4, 5, 9, 9, 9], [])]
    assert prefix_reuse_ratio(seqs) == pytest.approx(5 / 14)
    assert prefix_reuse_ratio(seqs, block=1) == prefix_reuse_ratio(seqs)
    assert prefix_reuse_ratio(seqs, block=2) == pytest.approx(4 / 14)
    assert prefix_reuse_ratio(seqs, block=8) == 0.0


@pytest.mark.parametrize("chunk", [3, 7, 1 << 20])
def test_truncated_json_array_keeps_complete_items(tmp_path, chunk):
    # Small chunks cut items, strings and numbers mid-way: they must come out whole anyway.
    items = [{"id": i, "conversations": [{"from": "human", "value": "x" * i}]} for i in range(5)]
    text = json.dumps(items, indent=2)
    cut = text[: text.index('"id": 4') + 3]
    p = tmp_path / "cut.json"
    p.write_text(cut)
    assert [d["id"] for d in iter_json_array(p, chunk)] == [0, 1, 2, 3]
    p.write_text(text)
    assert list(iter_json_array(p, chunk)) == items
    p.write_text("[12345, 678,\n 9]")
    assert list(iter_json_array(p, chunk)) == [12345, 678, 9]
    p.write_text('[{"a": 1}, {"a": oops}, {"a": 3}]')       # broken mid-file: stop there
    assert list(iter_json_array(p, chunk)) == [{"a": 1}]


def test_sharegpt_conversations_are_read_lazily(tmp_path, monkeypatch):
    import builtins

    from workshop.bench import workloads
    items = [{"id": str(i), "conversations": [{"from": "human", "value": str(i) * 100}]}
             for i in range(20_000)]
    p = tmp_path / "sharegpt.json"
    p.write_text(json.dumps(items))
    read = []

    def counting_open(*args, **kwargs):
        f = builtins.open(*args, **kwargs)
        real = f.read
        f.read = lambda n=-1: (lambda s: (read.append(len(s)), s)[1])(real(n))
        return f
    monkeypatch.setattr(workloads, "open", counting_open, raising=False)
    first = next(sharegpt_conversations(p))
    assert first == [{"from": "human", "value": "0" * 100}]
    assert sum(read) <= 1 << 20 < p.stat().st_size          # one chunk, not the whole file


def test_sharegpt_filters_and_seed(tok, tmp_path, monkeypatch):
    if tok.hf is None:
        pytest.skip("needs the model tokenizer")
    monkeypatch.setenv("WORKSHOP_CACHE", str(tmp_path / "cache"))
    convs = [{"id": str(i), "conversations": [
        {"from": "human", "value": ("tell me about the weather " * (1 + i % 5)).strip()},
        {"from": "gpt", "value": "It is sunny and warm today, enjoy. " * (1 + i % 3)},
        {"from": "human", "value": "and tomorrow?"},
        {"from": "gpt", "value": "Rain is expected all day long."}]}
        for i in range(60)]
    convs.append({"id": "short", "conversations": [{"from": "human", "value": "hi"},
                                                   {"from": "gpt", "value": "hello there friend"}]})
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    a = build_workload("sharegpt", tok, num_requests=20, seed=3, dataset_path=str(path))
    b = build_workload("sharegpt", tok, num_requests=20, seed=3, dataset_path=str(path))
    assert _requests(a) == _requests(b)
    assert all(tok.count(m[0]["content"]) >= 4 for m, *_ in _requests(a))  # "hi" is filtered out
    mt = build_workload("sharegpt-multiturn", tok, num_requests=8, seed=0, dataset_path=str(path))
    sent = plan(mt)
    assert len(sent) == 8 and len(mt.sessions) == 4
    second = sent[1].request.messages
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == sent[0].reply  # history carries the model's reply


def test_light_tokenizer_renders_the_chat_template(tok):
    if tok.hf is None:
        pytest.skip("needs the model tokenizer")
    text = tok.hf.apply_chat_template([{"role": "system", "content": "S"},
                                       {"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "yo"},
                                       {"role": "user", "content": "more"}],
                                      tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n"
                    "yo<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.prompt_ids(Request(1, messages=[{"role": "user", "content": "hi"}]))
    # special token kept whole
    assert ids[0] == tok.encode("<|im_start|>")[0] and len(tok.encode("<|im_start|>")) == 1
