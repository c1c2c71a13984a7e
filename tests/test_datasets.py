"""The packaged datasets: MT-Bench questions and the truncated ShareGPT file."""

import json

import pytest

from specmemo.datasets import DataError, load_questions, sharegpt_conversations


def test_mtbench_has_80_two_turn_questions():
    questions = load_questions()
    assert len(questions) == 80
    assert all(len(q.turns) == 2 for q in questions)
    assert questions[0].question_id == 81


def test_truncated_sharegpt_file_yields_only_complete_conversations(tmp_path):
    items = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model"}]},  # refused
        {"id": "c", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                                      {"from": "human", "value": "dangling"}]},  # trailing user turn dropped
        {"id": "d", "conversations": [{"from": "human", "value": "cut"}, {"from": "gpt", "value": "off mid"}]},
    ]
    text = json.dumps(items, indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.index("off mid") + 3])  # the file ends inside the last conversation
    got = list(sharegpt_conversations(path))
    assert got == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                   [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]


def test_packaged_sharegpt_parses_past_its_cut():
    count = sum(1 for _ in sharegpt_conversations())
    assert 10_000 < count < 20_000  # the file is cut off at 125.5 MB; all complete conversations are kept


def test_malformed_question_file_is_one_line_error(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2}\n')
    with pytest.raises(DataError, match=r"q.jsonl:2: expected a JSON object with a 'turns' list"):
        load_questions(path)


def test_humaneval_stubs_become_coding_requests():
    from specmemo.datasets import HUMANEVAL_ASK, humaneval_questions

    questions = humaneval_questions()
    assert len(questions) == 164 and [q.question_id for q in questions[:3]] == [0, 1, 2]
    first = questions[0].turns[0]
    assert first.startswith(HUMANEVAL_ASK) and "def has_close_elements(" in first and first.endswith("\n```")


def test_prompt_sets_take_the_first_n_of_each_in_order(tmp_path):
    from specmemo.datasets import prompt_sets

    own = tmp_path / "q.jsonl"
    own.write_text(json.dumps({"question_id": 7, "turns": ["mine"]}) + "\n")
    got = prompt_sets("humaneval, mt-bench," + str(own), per_set=2)
    assert [(q.category, q.question_id) for q in got] == [("humaneval", 0), ("humaneval", 1), ("writing", 81),
                                                          ("writing", 82), ("", 7)]
    for bad in ("", "humaneval,nope"):
        with pytest.raises(DataError, match="--prompts"):
            prompt_sets(bad, per_set=1)


def test_code_sessions_are_humaneval_tasks_then_a_users_follow_ups():
    from specmemo.datasets import HUMANEVAL_ASK, code_sessions, first_turns, humaneval_questions, prompt_sets

    sessions = prompt_sets("code-sessions", per_set=100)
    assert sessions == code_sessions() and len(sessions) == 12
    tasks = {q.question_id: q.turns[0] for q in humaneval_questions()}
    singles = {q.question_id for q in prompt_sets("humaneval", per_set=10)}
    for q in sessions:
        assert q.category == "code-session" and len(q.turns) == 4 and q.turns[0] == tasks[q.question_id]
        assert q.turns[0].startswith(HUMANEVAL_ASK) and q.question_id not in singles  # not the single-turn mix's
        assert len(set(q.turns[1:])) == 3
    assert all(len(q.turns) == 1 for q in first_turns(sessions))
