"""``specnb study run``: parameters checked first, resumable per notebook and parameters, skips said, Ctrl-C keeps
what finished, the README lists every verdict; and the study itself on another target, prompt file and corpus."""

from __future__ import annotations

import contextlib
import json
import os

import nbformat
import pytest

from specnb.cli import main
from specnb.study import study_run
from specnb.study.notebooks import find_notebooks


def _notebooks(folder, bodies: dict[str, str]) -> None:
    """Trivial notebooks: a parameters cell (``profile``, ``target``, ``x``) and one code cell each."""
    folder.mkdir()
    for name, code in bodies.items():
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell('profile = "quick"\ntarget = None\nx = 1', metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.fixture
def fake_notebooks(tmp_path, monkeypatch):
    folder = tmp_path / "notebooks"
    results = ('import json, os\nassert os.environ["SPECNB_STRICT_FIGURES"] == "1"  # figures saved strictly\n'
               'open(os.path.join(os.environ["SPECNB_FIGURES"], "{nn}_results.json"), "w").write('
               'json.dumps({{"verdicts": {{"a": {{"claim": "claim {nn}", "measured": "1.5 (1.2-1.8)", "expected": '
               '"> 1", "against": "a paper", "verdict": "agrees"}}}}}}))')
    _notebooks(folder, {"00_a": results.format(nn="00"), "01_b": results.format(nn="01"),
                        "07_pair": "y = 2"})
    monkeypatch.setattr(study_run, "find_notebooks", lambda names=None: find_notebooks(names, folder))
    return folder


def test_a_study_folder_resumes_by_code_and_parameters(fake_notebooks, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "run", "--profile", "smoke", "--target", "tiny-llama", "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert "00_a.ipynb: ok" in first and "01_b.ipynb: ok" in first
    assert "07_pair.ipynb: skipped: no draft for the given target" in first  # a target given, no draft
    readme = (out / "README.md").read_text()
    assert readme.startswith("# The study on tiny-llama") and "| target | `tiny-llama` (given) |" in readme
    assert "| claim 00 | 1.5 (1.2-1.8) | > 1 (a paper) | **agrees** |" in readme and "claim 01" in readme
    assert "### 07_pair.ipynb\n\nSkipped: no draft for the given target" in readme
    assert "| other published sources | 2 | 2 (0) | 0 | 0 (0 / 0) |" in readme  # the reference run's count table
    assert "### [00_a.ipynb](00_a.ipynb) (" in readme
    assert readme.index("## Figures") < readme.index("## Verdicts") < readme.index("## Setup and machine")
    assert (out / "00_a.ipynb").exists() and (out / "figures" / "01_results.json").exists()

    assert main(["study", "run", "--profile", "smoke", "--target", "tiny-llama", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert "00_a.ipynb: kept" in again and "01_b.ipynb: kept" in again
    assert main(["study", "run", "--profile", "smoke", "--target", "tiny-llama", "--out", str(out),
                 "-p", "01:x=2"]) == 0  # one notebook's parameter: that notebook alone reruns
    changed = capsys.readouterr().out
    assert "00_a.ipynb: kept" in changed and "01_b.ipynb: running" in changed
    executed = json.loads((out / "01_b.ipynb").read_text())
    assert any("x = 2" in "".join(c["source"]) for c in executed["cells"])  # papermill's injected cell

    assert main(["study", "run", "--profile", "smoke", "--target", "tiny-qwen2", "--out", str(out), "00"]) == 0
    assert "00_a.ipynb: running" in capsys.readouterr().out  # another target: another key


def test_bad_input_is_one_line_before_anything_runs(fake_notebooks, tmp_path, capsys):
    out = tmp_path / "study"
    for argv, message in ((["--timed-tokens", "0"], "parameter timed_tokens: must be a whole number >= 1"),
                          (["--corpus", str(tmp_path / "nowhere")], "parameter corpus: "),
                          (["--prompts", str(tmp_path / "none.jsonl")], "parameter prompts: "),
                          (["-p", "05-x=1"], "expected NN:NAME=VALUE"),
                          (["-p", "00:x=1", "-p", "00:x=2"], "-p '00:x=2': 00:x is already given (1)"),
                          (["-p", "09:x=1", "00"], "notebook 09 is not among those run"),
                          (["99"], "no notebook matches 99")):
        assert main(["study", "run", "--profile", "smoke", "--out", str(out), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("specnb: error: ") and message in err and err.count("\n") == 1, (argv, err)
    assert not out.exists() or not any(out.iterdir())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a study")
    assert main(["study", "run", "--profile", "smoke", "--out", str(mine)]) == 2
    assert "not a study folder" in capsys.readouterr().err and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def _started(*args, **kwargs):
    """papermill's stand-in where no notebook may start: ``specnb`` exits 130, as at Ctrl-C."""
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "{tmp}/fields.jsonl"], "parameter prompts: {tmp}/fields.jsonl:1: needs 'prompt'"),
    (["--prompts", "{tmp}/empty.jsonl"], "parameter prompts: {tmp}/empty.jsonl: no prompts"),
    (["--corpus", "{tmp}/fields.jsonl"], 'parameter corpus: {tmp}/fields.jsonl:1: expected {{"text": "..."}}'),
    (["--corpus", "{tmp}/empty.jsonl"], "parameter corpus: {tmp}/empty.jsonl: no documents"),
    (["--corpus", "{tmp}/binaries"], "parameter corpus: '{tmp}/binaries' holds no text files"),
    (["--target", "{tmp}/binaries"], "parameter target: '{tmp}/binaries' is neither a .gguf file nor a model folder"),
    (["--target", "tiny-llama", "--draft", "self:4"], "parameter draft: self-draft needs 1 <= L < 4"),
    (["-p", "00:y=1"], "-p 00:y=...: 00_a.ipynb has no parameter 'y'; its parameters: profile, target, x"),
    (["-p", "00:x=maybe"], "-p 00:x='maybe': 00_a.ipynb expects type int (its default: 1)"),  # a notebook's own
    (["-p", "00:x=True"], "-p 00:x=True: 00_a.ipynb expects type int (its default: 1)"),
    (["-p", "01:target=no-such-model"], "-p 01:...: parameter target: unknown model 'no-such-model'"),
    (["-p", "01:profile='big'"], "-p 01:...: parameter profile: unknown profile 'big'"),
    (["00", ""], "empty notebook name ''"),
])
def test_bad_data_is_one_line_before_anything_runs(argv, message, fake_notebooks, tmp_path, monkeypatch, capsys):
    """Prompts, corpus, target and draft are checked for what the notebooks read of them (a prompt file's every
    line; a JSONL corpus's first document, a folder with text files; a model folder; a self-draft shallower than
    the target), each ``-p`` name against the notebook's parameters cell and its value as the notebook would
    check it, and an empty notebook name refused, all before any notebook starts or the study folder is made."""
    import papermill

    (tmp_path / "fields.jsonl").write_text('{"id": 1, "tex": "a"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "binaries").mkdir()
    (tmp_path / "binaries" / "a.bin").write_bytes(b"\0\1")
    monkeypatch.setattr(papermill, "execute_notebook", _started)
    out = tmp_path / "study"
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    assert main(["study", "run", "--profile", "smoke", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specnb: error: {message.format(tmp=tmp_path)}") and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ("{}", "no 'notebooks' object"),
    ("[1]", "no 'notebooks' object"),
    ("not json", "not JSON: Expecting value: line 1 column 1 (char 0)"),
    ('{"notebooks": {"00_a": "ok"}}', "notebook '00_a' has no status among ok, skipped, failed"),
    ('{"notebooks": {"00_a": {"status": "ok", "seconds": 1}}}', "notebook '00_a', ok: 'key' missing or not a string"),
    ('{"notebooks": {"00_a": {"status": "skipped", "key": "k"}}}',
     "notebook '00_a', skipped: 'reason' missing or not a string"),
])
def test_a_malformed_study_state_is_one_line_and_left_as_it_is(text, message, fake_notebooks, tmp_path,
                                                                  monkeypatch, capsys):
    """A ``study.json`` that is not a state :func:`run_study` wrote is refused in one line saying to choose another
    ``--out``; nothing of the folder is changed and no notebook starts."""
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", _started)
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(text)
    assert main(["study", "run", "--profile", "smoke", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"specnb: error: {out / 'study.json'}: not a study state ({message}); give "
                                       "another --out (this one is left as it is)\n")
    assert [p.name for p in out.iterdir()] == ["study.json"] and (out / "study.json").read_text() == text


def test_ctrl_c_keeps_the_notebooks_that_finished(fake_notebooks, tmp_path, monkeypatch):
    import papermill

    real = papermill.execute_notebook

    def interrupted(path, *args, **kwargs):
        if "01_b" in str(path):
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(papermill, "execute_notebook", interrupted)
    out = tmp_path / "study"
    assert main(["study", "run", "--profile", "smoke", "--out", str(out)]) == 130
    state = json.loads((out / "study.json").read_text())["notebooks"]
    assert list(state) == ["00_a"] and state["00_a"]["status"] == "ok"
    assert "claim 00" in (out / "README.md").read_text()


def _study_on(target: str, tmp_path, monkeypatch) -> tuple:
    """The smoke study of every notebook on ``target`` (self:1 its draft), a JSONL prompt file (its first prompt
    a chat turn) and a folder corpus written here: (the folder, its state)."""
    prompts = tmp_path / "mine.jsonl"
    chat = {"id": "chat", "messages": [{"role": "user", "content": "def g(x, y):\n    return x + y"}]}
    prompts.write_text(json.dumps(chat) + "\n" + "".join(
        json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x, y):\n    return x"}) + "\n" for i in range(2)))
    corpus = tmp_path / "repo"
    corpus.mkdir()
    for i in range(10):
        (corpus / f"m{i}.py").write_text(f"def f{i}(x, y):\n    return x * {i} + y\n" * 40)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernels inherit it: tiny models run best on one thread
    out = tmp_path / "study"
    with _one_kernel(monkeypatch):
        state = study_run.run_study("smoke", None, out, {"target": target, "draft": "self:1", "prompts": prompts.name,
                                                         "corpus": corpus.name}, progress=False)
    return out, state


# Before each notebook: its figures closed and the namespace emptied, as a fresh kernel's would be; without the
# two full garbage collections %reset makes (about a second each with the model stack loaded; nothing needs them)
CLEAR = """
def _clear(shell=get_ipython()):
    import gc, sys
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")
    collect, gc.collect = gc.collect, lambda generation=2: 0
    try:
        shell.run_line_magic("reset", "-f")
    finally:
        gc.collect = collect
_clear()
"""


@contextlib.contextmanager
def _one_kernel(monkeypatch):
    """papermill runs every notebook in one kernel, its figures closed and namespace emptied before each: the
    kernel's start and the model stack's imports are paid once, not per notebook. The kernel starts at the first
    notebook, with the environment and folder papermill would have given it. The notebooks' own runs (``make
    figures``, tests/test_notebooks.py) start a fresh kernel each."""
    import papermill
    from jupyter_client.manager import KernelManager

    real, km = papermill.execute_notebook, KernelManager(kernel_name="python3")

    def in_the_kernel(path, out, **kwargs):
        if not km.has_kernel:
            km.start_kernel(cwd=kwargs.get("cwd"), env=dict(os.environ))
        client = km.client()  # one a notebook: a client that outlives a papermill run hears no more replies
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(CLEAR, timeout=60)
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok", reply["content"]
        return real(path, out, km=km, **kwargs)

    monkeypatch.setattr(papermill, "execute_notebook", in_the_kernel)
    try:
        yield
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)


@pytest.mark.parametrize("arch", [
    "llama", pytest.param("qwen2", marks=pytest.mark.repeat)])  # where the smoke profile says Gemma-3
def test_the_study_runs_every_notebook_on_another_model_and_data(arch, tmp_path, monkeypatch):
    """Every notebook runs on another target, a local folder named as a user's fine-tune would be, with a prompt
    file and a corpus folder, all given as paths relative to where the command runs; each passes the smoke run's
    checks (:func:`notebook_outputs.run_problems`: no error, warning or long progress bar, its figures saved and
    small, its conclusions rendered from its results file; the study's strict save refused any figure with layout
    problems); the results name the target; the README
    lists every verdict of every results file. make test's one run of notebooks 01-10 (in one kernel:
    :func:`_one_kernel`)."""
    from conftest import tiny
    from notebook_outputs import run_problems

    monkeypatch.chdir(tmp_path)  # relative paths, as typed at a prompt: the notebooks run from here
    target = f"./my-org_{arch}-3.2-1b-instruct-ft"
    tiny(arch).model.save_pretrained(target)
    tiny(arch).tokenizer.save_pretrained(target)
    out, state = _study_on(target, tmp_path, monkeypatch)
    assert {stem: r["status"] for stem, r in state.items()} == {p.stem: "ok" for p in find_notebooks()}, state
    readme = (out / "README.md").read_text()
    for results in sorted((out / "figures").glob("[0-9][0-9]_results.json")):
        record = json.loads(results.read_text())
        assert target in json.dumps(record["setup"]) + json.dumps(record["ours"]), results.name
        for verdict in record["verdicts"].values():
            assert f"| {verdict['claim']} | {verdict['measured']} |" in readme, verdict["claim"]
    for path in sorted(out.glob("[0-9][0-9]_*.ipynb")):
        assert run_problems(path, out / "figures") == [], path.name
