"""The local model server's helpers: the GGUF assembled from its pieces' packages, and clear errors before any
process starts (the server itself is exercised by the LLM tier, ``tests/llm``)."""

from __future__ import annotations

import sys

import pytest

from attune.agent.local_server import GGUF_MAGIC, ServerError, assemble_parts, serve


@pytest.fixture
def pieces(tmp_path, monkeypatch):
    root = tmp_path / "site"
    names = ("fakepart_a", "fakepart_b", "fakepart_c")
    blobs = (GGUF_MAGIC + b"\x03\x00" + b"a" * 100, b"b" * 77, b"c" * 5)
    for i, (name, blob) in enumerate(zip(names, blobs), start=1):
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
        (root / name / "data" / f"part{i:02d}.bin").write_bytes(blob)
    monkeypatch.syspath_prepend(str(root))
    yield names, b"".join(blobs)
    for name in names:
        sys.modules.pop(name, None)


def test_the_pieces_concatenate_in_order_into_the_model_once(pieces, tmp_path):
    names, whole = pieces
    dest = assemble_parts(tmp_path / "models" / "m.gguf", names)
    assert dest.read_bytes() == whole
    assert (tmp_path / "models" / "m.gguf.sha256").read_text().split()[1] == "m.gguf"
    stamp = dest.stat().st_mtime_ns
    assert assemble_parts(dest, names).stat().st_mtime_ns == stamp  # a whole file is kept as it is
    assert not list((tmp_path / "models").glob("*.part"))


def test_a_missing_piece_or_a_wrong_first_piece_is_a_clear_error(pieces, tmp_path):
    names, _ = pieces
    with pytest.raises(ServerError, match="fakepart-missing is not installed: run `make llm-qwen`"):
        assemble_parts(tmp_path / "m.gguf", (*names, "fakepart_missing"))
    first = tmp_path / "site" / names[0] / "data" / "part01.bin"
    first.write_bytes(b"PK\x03\x04" + first.read_bytes()[4:])  # not a GGUF file's first bytes
    with pytest.raises(ServerError, match="GGUF magic"):
        assemble_parts(tmp_path / "m.gguf", names)
    assert not (tmp_path / "m.gguf").exists()


def test_serving_a_file_that_is_not_there_fails_before_starting_anything(tmp_path):
    with pytest.raises(ServerError, match="no such model file"), serve(tmp_path / "nope.gguf", log=tmp_path / "l"):
        pass
