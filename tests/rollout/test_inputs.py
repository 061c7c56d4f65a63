"""Every bad input to ``rollout-check`` is refused before any work, naming the side at fault,
the file, the field and the position, with exit code 2 and nothing on stdout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tp_logprob.__main__ import main
from tp_logprob.engine_formats import sglang_rollout
from tp_logprob.errors import LogprobContractError
from tp_logprob.rollout import RolloutInputError, check_rollout

N, V = 6, 32


def _logits() -> torch.Tensor:
    return torch.randn(N, V, generator=torch.Generator().manual_seed(3))


def _sglang() -> dict[str, Any]:
    masks = [[t, t + 1, t + 2] for t in range(N)]
    return {
        "output_ids": [m[0] for m in masks],
        "meta_info": {
            "output_token_sampling_mask": masks,
            "output_token_sampling_logprobs": [-1.0] * N,
        },
    }


def _prime(counts: list[int], tokens: list[int] | None = None) -> dict[str, Any]:
    ids = [i for t, c in enumerate(counts) for i in range(t, t + c)]
    return {"ids": ids, "counts": counts, "token_ids": tokens or list(range(N))}


Files = dict[str, Path]
Case = tuple[str, Callable[[Files], list[str]], str, str]


def _write(files: Files, document: Any) -> None:
    files["response"].write_text(json.dumps(document))


def _sglang_with(change: Callable[[dict[str, Any]], None]) -> Callable[[Files], list[str]]:
    def build(files: Files) -> list[str]:
        document = _sglang()
        change(document)
        _write(files, document)
        return []

    return build


def _meta(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda document: document["meta_info"].__setitem__(key, value)


def _logits_file(value: Any, name: str = "x.pt") -> Callable[[Files], list[str]]:
    def build(files: Files) -> list[str]:
        _write(files, _sglang())
        torch.save(value, files["dir"] / name)
        return ["--logits", str(files["dir"] / name)]

    return build


def _text_logits(files: Files) -> list[str]:
    _write(files, _sglang())
    (files["dir"] / "x.json").write_text("[[0.0]]")
    return ["--logits", str(files["dir"] / "x.json")]


def _nonfinite(value: float) -> Callable[[Files], list[str]]:
    x = _logits()
    x[4, 7] = value
    return _logits_file(x)


def _document(document: Any) -> Callable[[Files], list[str]]:
    return lambda files: (_write(files, document), [])[1]


def _raw(text: str) -> Callable[[Files], list[str]]:
    return lambda files: (files["response"].write_text(text), [])[1]


def _args(*extra: str) -> Callable[[Files], list[str]]:
    return lambda files: (_write(files, _sglang()), list(extra))[1]


def _missing_shard(vocab: bool) -> Callable[[Files], list[str]]:
    def build(files: Files) -> list[str]:
        document = _sglang()
        document["meta_info"]["output_token_sampling_mask"][5] = [5, 6, 20]
        _write(files, document)
        torch.save(_logits()[:, :16].clone(), files["dir"] / "rank0.pt")
        return ["--logits", str(files["dir"] / "rank0.pt"), *(["--vocab", str(V)] if vocab else [])]

    return build


def _output(option: str) -> Callable[[Files], list[str]]:
    return lambda files: (
        _write(files, _sglang()),
        [option, str(files["dir"] / "missing" / "out")],
    )[1]


CASES: list[Case] = [
    ("logits a dict", _logits_file({"logits": _logits()}), "trainer logits (", "holds a dict"),
    ("logits a JSON file", _text_logits, "trainer logits (", "not a tensor saved with torch.save"),
    ("logits 1-D", _logits_file(torch.zeros(N)), "trainer logits (", "expected a 2-D tensor"),
    ("logits int", _logits_file(torch.zeros(N, V, dtype=torch.int32)), "trainer logits (", "dtype"),
    ("logits short", _logits_file(torch.zeros(N - 1, V)), "trainer logits (", "5 rows for 6"),
    ("NaN logit", _nonfinite(float("nan")), "trainer logits (", "logits[4, 7]=nan"),
    ("+inf logit", _nonfinite(float("inf")), "trainer logits (", "logits[4, 7]=inf"),
    ("missing logits file", lambda f: (_write(f, _sglang()), ["--logits", "nope.pt"])[1],
     "trainer logits (nope.pt)", "no such file"),
    ("missing shard, --vocab", _missing_shard(True), "trainer logits", "a TP shard missing"),
    ("missing shard", _missing_shard(False), "engine response or trainer logits",
     "mask id 20 at token 5 is past the logits' 16 columns"),
    ("not JSON", _raw("{\"output_ids\": [1,"), "engine response (", "not JSON"),
    ("missing response file", lambda f: (f["response"].unlink(), [])[1] if f["response"].exists()
     else [], "engine response (", "cannot be read"),
    ("empty batch", _document([]), "engine response", "no response to check"),
    ("empty token list", _sglang_with(lambda d: (d.__setitem__("output_ids", []),
     _meta("output_token_sampling_mask", [])(d), _meta("output_token_sampling_logprobs", [])(d))),
     "engine response (", "no output tokens"),
    ("vocab id as a string",
     _sglang_with(lambda d: d.__setitem__("output_ids", ["3", 1, 2, 3, 4, 5])),
     "engine response (", "output_ids[0]='3'"),
    ("logprobs shorter", _sglang_with(_meta("output_token_sampling_logprobs", [-1.0] * (N - 1))),
     "engine response (", "5 entries for 6 output tokens"),
    ("truncation flags as ints",
     _sglang_with(_meta("output_token_sampling_mask_truncated", [0, 1, 0, 0, 0, 0])),
     "engine response (", "output_token_sampling_mask_truncated[token 1]=1"),
    ("truncation flags too few",
     _sglang_with(_meta("output_token_sampling_mask_truncated", [0, 0])),
     "engine response (", "2 flags for 6 output tokens"),
    ("all-zero counts", _document(_prime([0] * N)), "engine response", "no token has a mask"),
    ("id past the vocabulary without a mask",
     _document({**_prime([3, 0, 3, 3, 3, 3]), "token_ids": [0, 99, 2, 3, 4, 5]}),
     "engine response", "output token 99 at token 1"),
    ("--index out of range", _args("--index", "3"), "option", "--index=3"),
    ("temperature 0", _args("--engine-temperature", "0"), "option", "--engine-temperature=0.0"),
    ("top-p 1.5", _args("--top-p", "1.5"), "option", "--top-p=1.5"),
    ("top-k 0", _args("--top-k", "0"), "option", "--top-k=0"),
    ("min-p 1", _args("--min-p", "1"), "option", "--min-p=1.0"),
    ("negative noise", _args("--logit-noise", "-1"), "option", "--logit-noise=-1.0"),
    ("negative noise slope", _args("--logit-noise-model", "0.1", "-1"), "option",
     "--logit-noise-model=(0.1, -1.0)"),
    ("both noises", _args("--logit-noise", "0.1", "--logit-noise-model", "0", "0.01"), "option",
     "give one noise, not both"),
    ("clip 1.5", _args("--clip", "1.5"), "option", "--clip=1.5"),
    ("--plot into a missing folder", _output("--plot"), "output (", "does not exist"),
    ("--json into a missing folder", _output("--json"), "output (", "does not exist"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "build", "side", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_any_work(
    name: str,
    build: Callable[[Files], list[str]],
    side: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = {"dir": tmp_path, "response": tmp_path / "response.json"}
    _write(files, _sglang())
    torch.save(_logits(), tmp_path / "x.pt")
    extra = build(files)
    logits = [] if "--logits" in extra else ["--logits", str(tmp_path / "x.pt")]
    status = main(["rollout-check", str(files["response"]), *logits, *extra])
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert out == "", "the refusal comes before any report"
    assert err.startswith("BAD   "), err
    assert side in err and message in err, err


def test_the_error_is_typed_and_names_its_side() -> None:
    x = _logits()
    x[2, 3] = float("nan")
    with pytest.raises(RolloutInputError) as caught:
        check_rollout(x, sglang_rollout(_sglang()))
    assert caught.value.side == "trainer logits"
    assert isinstance(caught.value, LogprobContractError)
    with pytest.raises(RolloutInputError, match=r"--vocab='32': expected an int"):
        check_rollout(_logits(), sglang_rollout(_sglang()), real_vocab_size="32")  # type: ignore[arg-type]
    with pytest.raises(LogprobContractError, match=r"vocab_size='32': expected an int"):
        sglang_rollout(_sglang(), vocab_size="32")  # type: ignore[arg-type]
