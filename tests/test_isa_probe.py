"""compile=true's first step: inductor's load probe of each vector instruction set's library is made once, then
answered from the note beside the library (algos/isa_probe.py)."""

import pytest

from rlcli.algos.isa_probe import NOTE_SUFFIX, remember_isa_probes, remembered


class CountedProbe:
    """Stands in for inductor's child process that loads a library: counts its calls, answers `loads`."""

    def __init__(self, loads: bool = True) -> None:
        self.calls, self.loads = 0, loads

    def __call__(self, isa, library_path: str) -> bool:
        self.calls += 1
        return self.loads


def test_a_library_that_loaded_is_not_probed_again_until_it_changes(tmp_path):
    library = tmp_path / "probe.so"
    library.write_bytes(b"first build")
    probe = CountedProbe()
    load = remembered(probe)
    assert load(None, str(library)) is True and probe.calls == 1
    assert (tmp_path / f"probe.so{NOTE_SUFFIX}").is_file()
    assert load(None, str(library)) is True and probe.calls == 1  # another process would read the same note
    assert remembered(probe)(None, str(library)) is True and probe.calls == 1
    library.write_bytes(b"a rebuilt library")  # another size: the note no longer describes it
    assert load(None, str(library)) is True and probe.calls == 2
    assert load(None, str(library)) is True and probe.calls == 2


def test_a_failed_load_is_asked_again_and_never_noted(tmp_path):
    library = tmp_path / "probe.so"
    library.write_bytes(b"build")
    probe = CountedProbe(loads=False)
    load = remembered(probe)
    assert load(None, str(library)) is False and load(None, str(library)) is False
    assert probe.calls == 2
    assert not (tmp_path / f"probe.so{NOTE_SUFFIX}").exists()


def test_a_missing_library_or_a_note_that_cannot_be_written_still_gets_the_probes_answer(tmp_path):
    probe = CountedProbe()
    load = remembered(probe)
    assert load(None, str(tmp_path / "absent.so")) is True and probe.calls == 1
    assert not list(tmp_path.iterdir())
    library = tmp_path / "probe.so"
    library.write_bytes(b"build")
    (tmp_path / f"probe.so{NOTE_SUFFIX}").mkdir()  # the note's path cannot be written (as root, too)
    assert load(None, str(library)) is True and load(None, str(library)) is True
    assert probe.calls == 3


def test_before_compiling_installs_it_once_on_inductors_probe():
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")
    if not hasattr(cpu_vec_isa.VecISA, "_probe_load"):
        pytest.skip("this torch has no separate load probe")
    from rlcli.algos.compiled import before_compiling

    before_compiling()
    installed = cpu_vec_isa.VecISA._probe_load
    assert getattr(installed, "remembered", False)
    remember_isa_probes()
    assert cpu_vec_isa.VecISA._probe_load is installed  # not wrapped twice
