"""Where the embedded server keeps its data, by who runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cortex import embedded


def test_a_set_folder_is_used_as_given_even_as_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(embedded.DATA_DIR_ENV, str(tmp_path / "here"))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert embedded.data_dir() == tmp_path / "here"


def test_root_keeps_out_of_its_private_home(monkeypatch: pytest.MonkeyPatch) -> None:
    # The package opens every folder above the data folder to all (go+rx)
    # when it runs as root: the default must not sit under /root.
    monkeypatch.delenv(embedded.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/root/.local/share")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert embedded.data_dir() == embedded.ROOT_DATA_DIR == Path("/var/lib/cortex")
    assert not embedded.data_dir().is_relative_to(Path.home())


def test_a_user_keeps_it_in_their_own_data_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(embedded.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert embedded.data_dir() == tmp_path / "cortex"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert embedded.data_dir() == Path.home() / ".local" / "share" / "cortex"
