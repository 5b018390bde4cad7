"""The gateway's routing policies on hand-computed outstanding counts (and, for the
prefix-aware policy, prompts)."""

from __future__ import annotations

import pytest

from workshop.api_gateway.routing import (
    Concentrate,
    Prefix,
    RoundRobin,
    Spread,
    chunk_hashes,
    make_policy,
    prompt_text,
)


def test_spread_takes_the_least_loaded_and_breaks_ties_round_robin():
    p = Spread()
    assert [p.choose([0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert p.choose([3, 1, 2]) == 1
    assert p.choose([2, 5, 2]) == 2                 # tie 0/2: the round robin resumes after 1
    assert p.choose([2, 5, 2]) == 0


def test_spread_on_a_live_sequence_keeps_replicas_level():
    p, out = Spread(), [0, 0]
    for _ in range(5):
        out[p.choose(out)] += 1
    assert out == [3, 2]


def test_concentrate_fills_the_first_then_overflows_in_order():
    p = Concentrate(max_per_replica=2)
    out = [0, 0, 0]
    chosen = []
    for _ in range(7):
        i = p.choose(out)
        chosen.append(i)
        out[i] += 1
    # 2 on the first, 2 on the second, 2 on the third, then the least loaded (the first)
    assert chosen == [0, 0, 1, 1, 2, 2, 0]
    assert p.choose([1, 0, 0]) == 0                 # room left on the first: it stays there
    assert p.choose([2, 3, 1]) == 2


def test_make_policy_names():
    assert make_policy("spread").name == "spread"
    assert make_policy("concentrate", 4).max_per_replica == 4
    assert make_policy("round_robin").name == "round_robin"
    p = make_policy("prefix", prefix_threshold=0.3, prefix_balance=2)
    assert (p.name, p.threshold, p.balance) == ("prefix", 0.3, 2)
    with pytest.raises(ValueError):
        make_policy("random")
    with pytest.raises(ValueError):
        Concentrate(0)


def test_round_robin_ignores_load():
    p = RoundRobin()
    assert [p.choose([5, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]


def test_every_policy_takes_a_prompt_and_only_prefix_reads_it():
    for name in ("spread", "concentrate", "round_robin", "prefix"):
        assert make_policy(name).choose([0, 0], "some prompt") in (0, 1)
        # the gateway extracts the prompt (JSON to text) only for a policy that reads it
        assert make_policy(name).reads_prompt == (name == "prefix")
    assert Spread().choose([1, 0], "x" * 500) == 1


# -- prefix-aware ------------------------------------------------------------------------------

def session(k: int, turns: int = 1) -> str:
    """A prompt of session k: a long system text of its own, then ``turns`` turns."""
    system = f"session {k:03d}, its system prompt: " + "lorem ipsum dolor sit amet " * 20
    return system + "".join(f" user turn {t} of session {k}." for t in range(turns))


def test_chunk_hashes_are_chained_and_drop_the_partial_chunk():
    a, b = chunk_hashes("abcdefgh" + "XYZ", 4), chunk_hashes("abcdEFGHabcd", 4)
    assert len(a) == 2 and len(b) == 3
    assert a[0] == b[0] and a[1] != b[1]
    # the same third chunk after a different second one hashes differently
    assert chunk_hashes("abcdefghabcd", 4)[2] != b[2]


def test_same_prefix_requests_stick_to_one_replica():
    p = Prefix(threshold=0.5, balance=4, chunk_chars=16)
    first = {k: p.choose([0, 0], session(k)) for k in range(2)}
    assert sorted(first.values()) == [0, 1]                  # two new sessions: spread
    for turn in range(2, 6):                                 # later turns come back
        for k in range(2):
            assert p.choose([1, 1], session(k, turn)) == first[k]
            assert p.last["why"] == "prefix"


def test_a_hot_prefix_spills_over_under_load_and_then_has_two_homes():
    p = Prefix(threshold=0.5, balance=2, chunk_chars=16)
    home = p.choose([0, 0, 0], session(7))
    out = [0, 0, 0]
    out[home] = 1
    chosen, why = [], []
    for q in range(6):                                       # all outstanding at once
        i = p.choose(out, session(7) + f" question {q}")
        chosen.append(i)
        why.append(p.last["why"])
        out[i] += 1
    assert chosen[:2] == [home, home]                        # then home holds 3: 3 - 0 > 2
    assert chosen[2] != home and why[2] == "spilled"
    # the spill's replica learned the prefix: the next request matches there, less loaded
    assert chosen[3] == chosen[2] and why[3] == "prefix"
    assert max(out) - min(out) <= 2
    # the replica it spilled to learned the prefix: both now match fully
    hashes = chunk_hashes(session(7), p.chunk_chars)
    assert sorted(p.matches(hashes)).count(len(hashes)) >= 2


def test_a_spill_is_labelled_as_one():
    p = Prefix(threshold=0.5, balance=1, chunk_chars=16)
    home = p.choose([0, 0], session(1))
    busy = [0, 0]
    busy[home] = 3
    assert p.choose(busy, session(1, 2)) != home and p.last["why"] == "spilled"


def test_unknown_prefixes_go_to_the_least_loaded():
    p = Prefix(threshold=0.5, balance=4, chunk_chars=16)
    p.choose([0, 0, 0], session(1))
    assert p.choose([3, 1, 2], session(2)) == 1
    assert p.last["why"] == "least loaded"
    assert p.choose([2, 2, 0], "") == 2                      # no full chunk: least loaded
    # a prompt sharing only a little of a known one stays below the threshold
    short_overlap = session(1)[:40] + "something else entirely " * 20
    assert p.choose([0, 5, 5], short_overlap) == 0 and p.last["why"] == "least loaded"


def test_the_index_stays_bounded_and_forgets_the_least_recently_sent_first():
    p = Prefix(threshold=0.5, balance=100, chunk_chars=16, max_chunks=80)
    n = len(chunk_hashes(session(0), 16))
    assert 2 * n <= 80 < 3 * n                               # room for two sessions, not three
    for k in range(30):
        p.choose([0], session(k))
        assert len(p.index[0]) <= 80
    # the newest session is fully known, the first one forgotten
    assert p.matches(chunk_hashes(session(29), 16)) == [n]
    assert p.matches(chunk_hashes(session(0), 16)) == [0]
    # a session sent again outlives newer ones sent once
    for k in range(30, 40):
        p.choose([0], session(1))
        p.choose([0], session(k))
    assert p.matches(chunk_hashes(session(1), 16)) == [n]


def test_prompt_text_extends_with_the_conversation_and_keeps_salts_apart():
    one = {"messages": [{"role": "system", "content": "S" * 100},
                        {"role": "user", "content": "hi"}]}
    two = {"messages": one["messages"] + [{"role": "assistant", "content": "hello"},
                                          {"role": "user", "content": "more"}]}
    assert prompt_text(two).startswith(prompt_text(one))
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["abc", "def"]}) == "abc"
    assert prompt_text({"prompt": [1, 2, 3]}) == "1 2 3"
    salted = prompt_text({**one, "cache_salt": "tenant-a"})
    assert salted != prompt_text(one) and not salted.startswith(prompt_text(one)[:50])
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert prompt_text(parts) == prompt_text({"messages": [{"role": "user", "content": "hi"}]})
    assert prompt_text({}) == ""


def test_the_gateway_routes_a_conversation_home_by_its_prompt():
    from workshop.api_gateway.app import Gateway

    gw = Gateway([("http://r0", None), ("http://r1", None)], {}, policy="prefix")
    first = {"messages": [{"role": "user", "content": session(1)}]}
    home = gw.route(first)    # still outstanding: the least-loaded replica is now the other
    later = {"messages": [*first["messages"], {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "and then?"}]}
    assert gw.route(later) == home
    assert gw.decisions == {"least loaded": 1, "prefix": 1}
