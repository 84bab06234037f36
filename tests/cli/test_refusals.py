"""Values that parse but cannot run are refused before any generation, naming the value and what is accepted."""

import pytest

from tests.commands import kvviz

TINY = ["run", "--model", "tiny", "--no-trace", "--prompt", "hello"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--temperature", "nan"], "temperature must be 0 (greedy) or a positive finite number, not nan"),
        (["--temperature", "inf"], "not inf"),
        (["--top-p", "nan"], "top-p must be in (0, 1]"),
        (["--seed", str(2**70)], "the seed must be an integer from 0 to 9223372036854775807"),
        (["--max-new-tokens", "10000000"], "longer than the model's context of 4096 tokens"),
        (["--strategy", "static", "--set", "max_cache_len=1000000000000"], "would need up to"),
    ],
)
def test_out_of_range_values_refused(extra, message):
    result = kvviz(*TINY, *extra)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in result.stderr


def test_prompt_longer_than_the_context_names_both_numbers(tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("the cache grows " * 2000)
    result = kvviz("run", "--model", "tiny", "--no-trace", "--raw", "--prompt-file", str(prompt),
                   "--max-new-tokens", "8")
    assert result.returncode == 2
    assert "the prompt (6001 tokens) plus max new tokens (8)" in result.stderr
    assert "context of 4096 tokens" in result.stderr


def test_prompt_that_is_not_utf8_refused():
    undecodable = b"\xff\xfe".decode(errors="surrogateescape")  # as Python hands a program such an argument
    result = kvviz(*TINY[:-1], undecodable)
    assert result.returncode == 2
    assert "the prompt is not valid UTF-8 text" in result.stderr
