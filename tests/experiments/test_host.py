"""experiments.host: the CPU line that run records and benchmark figures carry."""

import platform

from experiments import host

_TWO_CPUS = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
cpu family\t: 99
model name\t: Something Else
flags\t\t: fpu avx512f
"""


def test_first_processor_with_family_model_and_widest_vector_unit():
    assert host.cpu_model(_TWO_CPUS) == "AMD EPYC 7B13 [family 25 model 1, avx2]"


def test_no_vector_flags_and_missing_fields():
    text = "model name\t: Tiny Core\nflags\t: fpu sse2\n"
    assert host.cpu_model(text) == "Tiny Core [family ? model ?]"


def test_without_a_model_name_falls_back_to_platform():
    assert host.cpu_model("processor\t: 0\n") == (
        platform.processor() or platform.machine() or "unknown")


def test_this_host_is_named():
    assert host.cpu_model().strip()


def test_git_commit_dirty_means_code_not_results(tmp_path):
    """A changed record under experiments/results or README leaves the checkout clean; a
    changed code file (also when asked from a subdirectory) makes it dirty."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    record, code = tmp_path / "experiments" / "results" / "r.json", tmp_path / "pkg" / "m.py"
    record.write_text("{}")
    code.write_text("x = 1\n")
    (tmp_path / "README.md").write_text("verdicts")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert host.git_commit(tmp_path) == (head, False)
    record.write_text('{"rows": []}')
    (tmp_path / "README.md").write_text("a new verdict table")  # the reports rewrite it
    assert host.git_commit(tmp_path / "pkg") == (head, False)
    code.write_text("x = 2\n")
    assert host.git_commit(tmp_path / "pkg") == (head, True)
