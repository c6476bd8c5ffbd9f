"""The ``log-start-offset`` file (raylog.storage.log_start): its record, written whole, and a damaged one refused."""

import os

import pytest

from raylog.errors import StorageFormatError
from raylog.storage import log_start


def test_the_record_is_30_bytes_of_digits_a_space_their_crc_and_a_newline(tmp_path):
    log_start.write(str(tmp_path), 1234)
    data = (tmp_path / log_start.FILE_NAME).read_bytes()
    assert len(data) == log_start.SIZE == 30
    assert data[:20] == b"%020d" % 1234 and data[20:21] == b" " and data.endswith(b"\n")
    assert log_start.read(str(tmp_path)) == 1234
    assert not (tmp_path / (log_start.FILE_NAME + ".tmp")).exists()


def test_no_file_is_no_recorded_start(tmp_path):
    assert log_start.read(str(tmp_path)) is None


def test_a_rewrite_replaces_the_record_whole(tmp_path):
    log_start.write(str(tmp_path), 10**12)
    log_start.write(str(tmp_path), 7)
    assert log_start.read(str(tmp_path)) == 7


@pytest.mark.parametrize("damage", ["flip", "cut", "empty"])
def test_a_damaged_record_is_a_typed_error_naming_the_file_and_is_left_as_it_was(tmp_path, damage):
    log_start.write(str(tmp_path), 4096)
    path = tmp_path / log_start.FILE_NAME
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[5] ^= 0x01
    elif damage == "cut":
        data = data[:17]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(StorageFormatError, match="log start offset file is damaged") as err:
        log_start.read(str(tmp_path))
    assert err.value.details["path"] == str(path)
    assert path.read_bytes() == bytes(data)
    assert os.listdir(tmp_path) == [log_start.FILE_NAME]
