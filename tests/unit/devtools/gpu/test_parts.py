"""devtools/gpu/parts.py: what fits one device call, the split into parts, the refusal."""

from __future__ import annotations

import subprocess

import pytest

from devtools.gpu import parts

MIB = 1024 * 1024


def test_a_packed_file_splits_into_a_first_part_and_rests_that_add_up():
    assert parts.split_sizes(100, 60, 30) == [60, 30, 10]
    assert parts.split_sizes(50, 60, 30) == [50]
    assert parts.split_sizes(60, 60, 30) == [60]
    assert parts.split_sizes(0, 60, 30) == [0]
    sizes = parts.split_sizes(74_000_000, 61_000_000, 40_000_000)
    assert sum(sizes) == 74_000_000 and sizes[0] == 61_000_000 and len(sizes) == 2


@pytest.mark.parametrize(("first", "rest"), [(0, 10), (10, 0), (-1, 5)])
def test_a_part_size_that_is_not_positive_is_refused(first, rest):
    with pytest.raises(ValueError, match="positive"):
        parts.split_sizes(100, first, rest)


def test_written_parts_concatenate_back_to_the_source(tmp_path):
    source = tmp_path / "packed"
    data = bytes(range(256)) * 9000 + b"tail"
    source.write_bytes(data)
    sizes = parts.split_sizes(len(data), 1_000_000, 700_000)
    dests = [tmp_path / "a" / "p0"] + [tmp_path / "b" / f"p{i}" for i in range(1, len(sizes))]
    parts.write_parts(source, dests, sizes)
    assert [d.stat().st_size for d in dests] == sizes
    assert b"".join(d.read_bytes() for d in dests) == data


def test_parts_that_do_not_add_up_to_the_source_are_refused(tmp_path):
    source = tmp_path / "packed"
    source.write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="parts of 9 bytes"):
        parts.write_parts(source, [tmp_path / "p0", tmp_path / "p1"], [5, 4])
    with pytest.raises(ValueError, match="2 destinations for 1 parts"):
        parts.write_parts(source, [tmp_path / "p0", tmp_path / "p1"], [10])


def test_a_call_fits_only_with_the_working_tree_and_the_slack_counted():
    room = parts.room_beside_tree(4 * MIB)
    assert room == parts.CALL_LIMIT_BYTES - 4 * MIB - parts.SLACK_BYTES
    assert parts.CallSize("stage", room, 4 * MIB).fits()
    assert not parts.CallSize("stage", room + 1, 4 * MIB).fits()


def test_a_folder_over_the_limit_is_refused_with_the_numbers_and_a_next_step():
    too_big = parts.CallSize("run call (.gpu-b)", 62 * MIB, 4 * MIB)
    with pytest.raises(parts.BundleTooLarge) as refused:
        parts.check_fits(too_big)
    message = str(refused.value)
    assert "run call (.gpu-b): 62.0 MiB + working tree 4.0 MiB = 66.0 MiB of 64.0 MiB" in message
    assert "too many" in message and "make gpu-bundle again" in message
    parts.check_fits(parts.CallSize("stage", 10 * MIB, 4 * MIB))  # fits: no error


def test_a_working_tree_that_fills_the_call_leaves_no_room_and_says_so():
    with pytest.raises(parts.BundleTooLarge, match="the working tree alone is 63.5 MiB"):
        parts.room_beside_tree(int(63.5 * MIB))


def test_the_working_tree_counts_tracked_and_untracked_files_but_not_ignored_ones(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/big/\n")
    (tmp_path / "tracked.txt").write_bytes(b"a" * 100)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt", ".gitignore"], check=True)
    (tmp_path / "untracked.txt").write_bytes(b"b" * 30)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "part").write_bytes(b"c" * 5000)
    assert parts.working_tree_bytes(tmp_path) == 100 + 30 + len("/big/\n")
    assert parts.folder_bytes(tmp_path / "big") == 5000
