"""devtools/gpu/pack_ort.py: only the kept GPU's machine code survives, every offset stays."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from devtools.gpu import pack_ort

from .fake_ort import PAYLOAD_BYTES, elf_with_fatbin, fake_wheel


def test_other_archs_machine_code_is_zeroed_and_the_kept_one_is_untouched():
    original = elf_with_fatbin([90, 80, 120])
    lib = bytearray(original)
    zeroed, kept = pack_ort.zero_other_archs(lib, {90})
    assert (zeroed, kept) == (2 * PAYLOAD_BYTES, PAYLOAD_BYTES)
    assert len(lib) == len(original)
    assert bytes([90]) * PAYLOAD_BYTES in lib
    assert bytes([80]) * PAYLOAD_BYTES not in lib and bytes([120]) * PAYLOAD_BYTES not in lib
    changed = [i for i, (a, b) in enumerate(zip(original, lib, strict=True)) if a != b]
    assert len(changed) == 2 * PAYLOAD_BYTES  # the payloads only, headers and offsets stay


def test_a_fatbin_layout_it_does_not_know_is_refused_not_guessed():
    lib = bytearray(elf_with_fatbin([90]))
    off, size = pack_ort.elf_section(bytes(lib), ".nv_fatbin")
    lib[off + size - 4] = 7  # garbage where padding should be
    with pytest.raises(ValueError, match="format changed"):
        pack_ort.zero_other_archs(lib, {90})


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs zstd")
def test_the_packed_tree_unpacks_to_the_wheel_with_the_provider_trimmed(tmp_path):
    wheel = fake_wheel(tmp_path, [90, 80])
    out = tmp_path / "ort.tar.zst"
    info = pack_ort.pack(wheel, out, {90})
    assert info["machine_code_zeroed_bytes"] == PAYLOAD_BYTES
    assert info["packed_bytes"] == out.stat().st_size
    site = tmp_path / "site"
    site.mkdir()
    subprocess.run(f"zstd -d -q --long=27 -c {out} | tar -C {site} -xf -", shell=True,
                   check=True)
    lib = (site / pack_ort.PROVIDER).read_bytes()
    assert bytes([90]) * PAYLOAD_BYTES in lib and bytes([80]) * PAYLOAD_BYTES not in lib
    assert (site / "onnxruntime" / "__init__.py").exists()
