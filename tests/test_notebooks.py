"""Every numbered notebook runs end to end under papermill with profile=smoke (tiny models, seconds), writes its
results file and renders its conclusions from it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from specnb.study.notebooks import code_lines, find_notebooks, run_notebooks

NOTEBOOKS = find_notebooks()


def test_there_are_notebooks():
    assert any(p.name == "00_quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_has_a_tagged_parameters_cell(path):
    """papermill injects its parameters after the cell tagged ``parameters``, which sets ``profile``."""
    source = json.loads(path.read_text())
    tagged = [c for c in source["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert tagged and "profile" in "".join(tagged[0]["source"]), "needs a tagged parameters cell with profile"


# make test-full only: tests/test_study_run.py runs every notebook through papermill with these same checks on another
# model, prompts and corpus, and the edited-parameters run below takes notebook 00 on the smoke profile's own models
@pytest.mark.repeat
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_with_smoke_profile(path, tmp_path, monkeypatch):
    """papermill's path (make figures) on the smoke profile's own models: the notebook runs, and
    :func:`notebook_outputs.run_problems` finds nothing (no traceback, warning or long progress bar, a figure saved,
    conclusions rendered from ``NN_results.json``); a figure with overlapping text, a legend over data or a panel
    of one value fails the run (``run_notebooks`` saves strictly)."""
    from notebook_outputs import run_problems

    monkeypatch.setattr("specnb.study.notebooks.figures_for", lambda profile: tmp_path / "figures")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it: tiny models run best on one thread
    [run] = run_notebooks("smoke", [path.stem], output_dir=tmp_path)
    assert run.error is None, run.error
    assert run.executed.exists()
    assert run_problems(run.executed, tmp_path / "figures") == []


@pytest.mark.parametrize("path", [pytest.param(p, marks=[] if p.stem.startswith("00_") else pytest.mark.repeat)
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_after_its_parameters_cell_is_edited(path, tmp_path, monkeypatch):
    """The interactive path papermill does not take: a reader opens the notebook, edits ``profile`` in its
    parameters cell to smoke and runs every cell in a fresh kernel."""
    from notebook_outputs import output_problems, run_edited

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path / "figures"))  # the kernel inherits it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    executed = run_edited(path, "smoke", path.parent)
    assert output_problems(executed) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_published_outputs_match_their_code(path):
    """A committed notebook either has no outputs or carries the reference run's: stamped by ``specnb
    notebooks publish`` with the hash of the code that produced them (a code change without a rerun fails),
    from the quick profile, and clean (no traceback, warning or long progress bar)."""
    from notebook_outputs import output_problems

    from specnb.study.reference_run import STAMP, code_hash

    notebook = json.loads(path.read_text())
    if not any(c.get("outputs") for c in notebook["cells"] if c["cell_type"] == "code"):
        return
    stamp = notebook["metadata"].get(STAMP)
    assert stamp is not None, "outputs without the reference run's stamp: publish with `specnb notebooks publish`"
    assert stamp["profile"] == "quick" and stamp["code_hash"] == code_hash(notebook), \
        f"{path.name}: its code changed since the reference run ({stamp['commit']}); rerun and publish it"
    assert output_problems(notebook) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_measured_number_is_typed_into_a_conclusion(path):
    """Markdown cells under a Conclusions heading hold no digits: numbers come from the rendered cell."""
    cells = json.loads(path.read_text())["cells"]
    conclusions = [c for c in cells if c["cell_type"] == "markdown" and "conclusion" in "".join(c["source"]).lower()
                   or c["cell_type"] == "markdown" and "what this shows" in "".join(c["source"]).lower()]
    for cell in conclusions:
        text = "".join(cell["source"])
        assert not any(ch.isdigit() for ch in text.split("\n", 1)[-1]), f"typed number in: {text[:80]!r}"


def paper_calls(path) -> list[ast.Call]:
    """The ``report.paper(...)`` calls of a notebook's code cells."""
    calls = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            source = "\n".join(line for line in "".join(cell["source"]).splitlines() if not line.startswith(("%", "!")))
            calls += [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute) and node.func.attr == "paper"]
    return calls


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_paper_number_is_typed_into_a_notebook(path):
    """A notebook states the papers' numbers from the experiment module that judges them, ``report.paper(
    **module.CLAIMS.stated())``: the numbers are data in one place, never typed in a code cell."""
    for call in paper_calls(path):
        assert not call.args and len(call.keywords) == 1 and call.keywords[0].arg is None, ast.unparse(call)
        value = call.keywords[0].value
        assert (isinstance(value, ast.Call) and not value.args and isinstance(value.func, ast.Attribute)
                and value.func.attr == "stated" and isinstance(value.func.value, ast.Attribute)
                and value.func.value.attr == "CLAIMS"), f"{path.name}: {ast.unparse(call)}"


def test_the_paper_check_fails_on_a_typed_number(tmp_path):
    notebook = tmp_path / "04_x.ipynb"
    cell = {"cell_type": "code", "source": ["report.paper(gain=0.17, source='CREST')\n"], "outputs": []}
    notebook.write_text(json.dumps({"cells": [cell]}))
    with pytest.raises(AssertionError):
        test_no_paper_number_is_typed_into_a_notebook(notebook)


MAX_CODE_LINES = 60  # non-plotting code lines per notebook: the logic lives in specnb, the notebook calls it


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_stay_thin(path):
    counts = code_lines(path)
    assert counts["code"] <= MAX_CODE_LINES, f"{path.name}: {counts['code']} non-plotting code lines (max " \
        f"{MAX_CODE_LINES}); move the logic into specnb.experiments (plot helpers into specnb.study.plots)"


def test_code_lines_tells_plotting_from_code(tmp_path):
    import nbformat

    cells = ['profile = "quick"\nx = 1', "import matplotlib.pyplot as plt\nimport numpy as np\n\n# a comment",
             "table = np.arange(3)\nfig, ax = plt.subplots()\nfor value in table:\n    ax.plot(value, value)\n"
             "label = ax.get_title()\nfor value in table:\n    total = value\n    ax.plot(total, 0)",
             'text = f"""\nmarkdown {table}\n"""\nlabel = len(table)  # rebound by code: plain again\n'
             "print(label)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, tmp_path / "00_x.ipynb")
    # code: import numpy, table =, the second loop's header and its assignment, text = (not the string's inside
    # nor its closing line), label =, print; plotting: import matplotlib, subplots, the first loop (2 lines),
    # label = ax..., the second loop's ax.plot
    assert code_lines(tmp_path / "00_x.ipynb") == {"code": 7, "plotting": 6}


def test_a_failing_notebook_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    """`specnb notebooks run` goes on after a failure, lists every failure at the end and exits non-zero."""
    import nbformat

    from specnb.cli import main
    from specnb.study import notebooks

    folder = tmp_path / "notebooks"
    folder.mkdir()
    strict = "import os\nassert os.environ['SPECNB_STRICT_FIGURES'] == '1'"  # the kernels save figures strictly
    for name, code in (("00_fails", "raise RuntimeError('boom')"), ("01_runs", strict), ("02_fails", "1 / 0")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('profile = "quick"',
                                                                        metadata={"tags": ["parameters"]}),
                                             nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")
    monkeypatch.setattr(notebooks, "NOTEBOOKS", folder)
    monkeypatch.setattr(notebooks, "find_notebooks", lambda names=None: sorted(folder.glob("*.ipynb")))
    monkeypatch.setattr(notebooks, "figures_for", lambda profile: tmp_path / "figures")
    assert main(["notebooks", "run", "--profile", "smoke"]) == 1
    out, err = capsys.readouterr()
    assert "01_runs.ipynb: ok" in out and "1 of 3 notebooks ran" in out
    assert "00_fails.ipynb failed (PapermillExecutionError" in err and "02_fails.ipynb failed" in err
    run = json.loads((tmp_path / "figures" / "RUN.json").read_text())  # each notebook's time beside the bandwidth
    assert run["failed"] == ["00_fails.ipynb", "02_fails.ipynb"]
    assert set(run["read_gb_per_s"]) == set(run["notebook_seconds"])
    assert all(v > 0 for v in run["read_gb_per_s"].values())
    nb = nbformat.read(folder / "00_fails.ipynb", as_version=4)  # fixed and rerun alone: the stamp says so
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, folder / "00_fails.ipynb")
    chosen = {"00_fails": [folder / "00_fails.ipynb"]}
    monkeypatch.setattr(notebooks, "find_notebooks",
                        lambda names=None: sorted(folder.glob("*.ipynb")) if names is None else chosen[names[0]])
    assert main(["notebooks", "run", "--profile", "smoke", "00_fails"]) == 0
    amended = json.loads((tmp_path / "figures" / "RUN.json").read_text())
    assert amended["failed"] == ["02_fails.ipynb"] and set(amended["rerun"]) == {"00_fails"}
    assert set(amended["rerun"]["00_fails"]) == {"date", "commit", "dirty"}
    assert amended["notebook_seconds"]["01_runs"] == run["notebook_seconds"]["01_runs"]
    (tmp_path / "figures" / "RUN.json").unlink()  # the first part of a run: stamped, the rest named as not run
    assert main(["notebooks", "run", "--profile", "smoke", "00_fails"]) == 0
    first = json.loads((tmp_path / "figures" / "RUN.json").read_text())
    assert first["not_run"] == ["01_runs", "02_fails"] and first["failed"] == []


# `specnb notebooks run` over the notebooks of the folder argv[1], its figures beside that folder; argv[2] = "start":
# the command signals itself (SIGINT, as a terminal's Ctrl-C) as soon as the first kernel's process runs, before the
# kernel can take a SIGINT
_RUN_FOLDER = """
import os
import signal
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from specnb.cli import main
from specnb.study import notebooks

folder = Path(sys.argv[1])
notebooks.NOTEBOOKS = folder
notebooks.find_notebooks = lambda names=None: sorted(folder.glob("*.ipynb"))
notebooks.figures_for = lambda profile: folder.parent / "figures"
if sys.argv[2] == "start":
    real = AsyncKernelManager.start_kernel

    async def start_kernel(self, **kw):
        await real(self, **kw)
        os.kill(os.getpid(), signal.SIGINT)

    AsyncKernelManager.start_kernel = start_kernel
sys.exit(main(["notebooks", "run", "--profile", "smoke"]))
"""


@pytest.mark.parametrize("moment", ["cell", "start"])
def test_ctrl_c_stops_the_notebook_and_keeps_the_notebooks_that_finished(moment, tmp_path):
    """A terminal's Ctrl-C (SIGINT to the command) while a cell runs, or while the kernel starts (it would ignore
    a SIGINT then; that run leaves out the notebook before): the notebook stops (its executed copy says where),
    the earlier executed copy of it stays whole, the notebooks that finished are stamped in RUN.json, the rest
    named as not run, and the only output on stderr is one line; the kernel's own log (ipykernel's warnings and
    tracebacks) goes to a file."""
    import signal
    import subprocess
    import sys
    import time

    import nbformat

    folder, started = tmp_path / "notebooks", tmp_path / "started"
    executed = folder / "executed" / "smoke"
    executed.mkdir(parents=True)
    codes = {"00_done": "x = 1", "01_waits": f"open({str(started)!r}, 'w').close()\nimport time\ntime.sleep(300)",
             "02_never": "x = 3"}
    if moment == "start":
        del codes["00_done"]
    for name, code in codes.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('profile = "quick"',
                                                                        metadata={"tags": ["parameters"]}),
                                             nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")
    (executed / "01_waits.ipynb").write_text("an earlier run's copy")
    child = subprocess.Popen([sys.executable, "-c", _RUN_FOLDER, str(folder), moment], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    if moment == "cell":
        deadline = time.monotonic() + 120
        while not started.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130 and err == "specnb: interrupted\n", (out, err)
    assert "01_waits.ipynb: interrupted after" in out and "02_never" not in out
    assert started.exists() == (moment == "cell")
    stopped = nbformat.read(executed / ".01_waits.partial.ipynb", as_version=4)
    assert [o.get("ename") for c in stopped.cells for o in c.get("outputs", [])] == ["KeyboardInterrupt"]
    assert (executed / "01_waits.ipynb").read_text() == "an earlier run's copy"
    assert (executed / "01_waits.kernel.log").exists()
    if moment == "start":
        return
    assert "00_done.ipynb: ok" in out
    assert nbformat.read(executed / "00_done.ipynb", as_version=4).cells[-1].execution_count
    assert not (executed / ".00_done.partial.ipynb").exists()
    run = json.loads((tmp_path / "figures" / "RUN.json").read_text())
    assert list(run["notebook_seconds"]) == ["00_done"] and run["not_run"] == ["01_waits", "02_never"]


@pytest.mark.parametrize("argv, message", [
    (["lines", ""], "empty notebook name ''"),
    (["run", ""], "empty notebook name ''"),
    (["run", "00", " "], "empty notebook name ' '"),
    (["run", "99"], "no notebook matches 99"),
    (["run", "0"], "notebook name '0' matches 10 notebooks (00_quickstart, 01_hidden_states,"),
])
def test_a_bad_notebook_name_is_one_line_before_anything_runs(argv, message, tmp_path, monkeypatch, capsys):
    """An empty name (a prefix of every notebook's) chooses none, and a name matching none or several is refused,
    before a notebook starts or a folder is made."""
    import papermill

    from specnb.cli import main
    from specnb.study import notebooks

    def started(*args, **kwargs):
        raise KeyboardInterrupt  # exit 130: a notebook started

    monkeypatch.setattr(papermill, "execute_notebook", started)
    monkeypatch.setattr("specnb.model.ceilings.sample_read_bandwidth", lambda *args: 1.0)
    monkeypatch.setattr(notebooks, "NOTEBOOKS", tmp_path)  # where the executed copies would go
    monkeypatch.setattr(notebooks, "figures_for", lambda profile: tmp_path / "figures")
    assert main(["notebooks", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specnb: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


COMPARED = {"claim": "c", "measured": "1.5 (1.2-1.8)", "expected": "> 1", "against": "a paper", "verdict": "agrees",
            "ours": 1.5, "low": 1.2, "high": 1.8}
"""A comparison of a results file as :meth:`specnb.study.results.Results.write` writes it (the fields read)."""


def _figures(folder: Path, files: dict[str, str]) -> str:
    """A figures folder holding ``files`` ({NN: results file text}); its path."""
    folder.mkdir()
    for prefix, text in files.items():
        (folder / f"{prefix}_results.json").write_text(text)
    return str(folder)


@pytest.mark.parametrize("text, message", [
    ("[]", "a JSON list, not an object"),
    ("{", "not JSON: Expecting property name enclosed in double quotes"),
    (json.dumps({"verdicts": [COMPARED]}), "'verdicts' is a JSON list, not an object"),
    (json.dumps({"verdicts": {"a": {"claim": "c"}}}), "comparison 'a' has no 'measured', 'expected', 'against', "
     "'verdict', 'ours', 'low', 'high'"),
    (json.dumps({"verdicts": {"a": {**COMPARED, "ours": "1.5"}}}), "comparison 'a': 'ours' must be a number or "
     "null, got '1.5'"),
    (json.dumps({"verdicts": {"a": {**COMPARED, "verdict": "maybe"}}}), "comparison 'a': verdict 'maybe', lean None"),
    (json.dumps({"verdicts": {}, "setup": {"DReSD": {"here": {}}}}), "setup 'DReSD' is not {'here': {...}, "),
])
def test_figures_compare_names_a_malformed_results_file(text, message, tmp_path, capsys):
    """`specnb figures compare` refuses a results file it cannot read in one line naming the file and what is
    wrong with it."""
    from specnb.cli import main

    old = _figures(tmp_path / "old", {"00": text})
    new = _figures(tmp_path / "new", {"00": json.dumps({"verdicts": {"a": COMPARED}})})
    assert main(["figures", "compare", old, new]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specnb: error: {old}/00_results.json: not a results file ({message}") \
        and err.count("\n") == 1, err


@pytest.mark.parametrize("in_old, in_new, message", [
    ((), ("00",), "'{old}' holds no NN_results.json: nothing to compare"),
    (("00",), (), "'{new}' holds no NN_results.json: nothing to compare"),
    (("01",), ("00", "02"), "'{old}' (notebooks 01) and '{new}' (notebooks 00, 02) share no notebook's results"),
])
def test_figures_compare_with_nothing_to_compare_is_an_error(in_old, in_new, message, tmp_path, capsys):
    """Two runs share no notebook's results (one holds none): an error, not "0 of 0 moved"."""
    from specnb.cli import main

    text = json.dumps({"verdicts": {"a": COMPARED}})
    old = _figures(tmp_path / "old", dict.fromkeys(in_old, text))
    new = _figures(tmp_path / "new", dict.fromkeys(in_new, text))
    assert main(["figures", "compare", old, new]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specnb: error: {message.format(old=old, new=new)}") and err.count("\n") == 1, err


def test_figures_compare_of_results_without_a_shared_verdict_is_an_error(tmp_path, capsys):
    from specnb.cli import main

    old = _figures(tmp_path / "old", {"00": "{}"})
    new = _figures(tmp_path / "new", {"00": json.dumps({"verdicts": {"a": COMPARED}})})
    assert main(["figures", "compare", old, new]) == 2
    assert capsys.readouterr().err == "specnb: error: the notebooks both runs hold (00) share no verdict: nothing to " \
                                      "compare\n"


def test_a_run_is_dirty_where_code_changed_not_where_publishing_wrote_outputs(tmp_path, monkeypatch):
    """A notebook whose cells' sources equal the commit's is clean though its outputs differ (a publish wrote
    them); a changed source, a changed module or a deleted file is dirty."""
    from specnb.study import reference_run

    def notebook(source: str, output: str) -> str:
        return json.dumps({"cells": [{"cell_type": "code", "source": [source], "outputs": [{"text": output}]}]})

    committed = {"notebooks/01.ipynb": notebook("x = 1", "old"), "specnb/m.py": "a = 1\n"}
    changed: list[str] = []
    fake = {"diff": lambda *a: "\n".join(changed), "show": lambda ref: committed[ref.split(":", 1)[1]]}
    monkeypatch.setattr(reference_run, "git", lambda command, *args: fake[command](*args))
    monkeypatch.setattr(reference_run, "ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks/01.ipynb").write_text(notebook("x = 1", "new outputs"))
    assert not reference_run._dirty()
    changed.append("notebooks/01.ipynb")
    assert not reference_run._dirty()  # outputs only
    (tmp_path / "notebooks/01.ipynb").write_text(notebook("x = 2", "new outputs"))
    assert reference_run._dirty()
    changed[:] = ["specnb/m.py"]  # not a notebook: any change counts, here a deleted file
    assert reference_run._dirty()


def test_a_bad_parameter_stops_the_quickstart_in_its_first_cell(tmp_path, monkeypatch):
    """Under papermill a bad value stops notebook 00's first cell with one line naming the parameter, before any
    model loads. (Good values on another target and a prompt file: tests/test_study_run.py.)"""
    monkeypatch.setattr("specnb.study.notebooks.figures_for", lambda profile: tmp_path / "figures")
    [bad] = run_notebooks("smoke", ["00_quickstart"], output_dir=tmp_path, parameters={"timed_tokens": 0})
    assert bad.error == "PapermillExecutionError: ParameterError: parameter timed_tokens: must be a whole number " \
                        ">= 1, got 0"


@pytest.mark.parametrize("given, message", [
    ({"target": "no-such-model"}, "parameter target: "),
    ({"draft": "nobody/nothing-here"}, "parameter draft: "),
    ({"prompts": "/no/such.jsonl"}, "parameter prompts: '/no/such.jsonl' is neither a prompt set"),
    ({"corpus": "/no/such/folder"}, "parameter corpus: '/no/such/folder' is neither `code`"),
    ({"device": "tpu"}, "parameter device: invalid device"),
    ({"dtype": "int4"}, "parameter dtype: unknown dtype"),
    ({"weights": "gguf"}, "parameter weights: weights 'gguf' needs a GGUF file"),
    ({"target": "gemma-3-270m", "weights": "gguf", "dtype": "float16"},
     "parameter weights: weights 'gguf' runs on specnb's CPU kernels in float32 or bfloat16 (asked: dtype float16"),
    ({"timed_prompts": 2.5}, "parameter timed_prompts: must be a whole number"),
    ({"target": 3}, "parameter target: must be a string"),
    ({"colour": "red"}, "unknown parameter 'colour'"),
    ({"target": "tiny-llama", "draft": "self:4"}, "parameter draft: self-draft needs 1 <= L < 4"),
    ({"target": str(Path(__file__).parent)}, f"parameter target: '{Path(__file__).parent}' is neither a .gguf file"),
])
def test_a_bad_parameter_is_one_line_naming_it(given, message):
    from specnb.study.profiles import ParameterError, get_profile

    with pytest.raises(ParameterError) as refused:
        get_profile("smoke", **given)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_parameters_replace_the_profiles_values_and_none_keeps_them():
    from specnb.draft_shapes import SelfDraft
    from specnb.study.profiles import PROFILES, ParameterError, get_profile

    p = get_profile("smoke", timed_tokens=5, draft=None, weights="bf16")
    assert (p.timed_tokens, p.weights) == (5, "bf16")
    assert p.draft == PROFILES["smoke"].draft and get_profile("smoke") == PROFILES["smoke"]
    # the profile's draft (self:2) and notebook 07's pair belong to its target: another target has neither ...
    other = get_profile("smoke", target="tiny-qwen2")
    assert (other.target, other.draft, other.pair) == ("tiny-qwen2", None, None)
    # ... unless a draft is given with it
    paired = get_profile("smoke", target="tiny-qwen2", draft="self:1")  # a notebook's string, parsed once here
    assert (paired.draft, paired.pair) == (SelfDraft(1), ("tiny-qwen2", SelfDraft(1)))
    with pytest.raises(ParameterError, match="parameter draft: invalid self-draft 'self:0'"):
        get_profile("smoke", draft="self:0")


@pytest.mark.repeat  # make test-full: tests/test_study_run.py runs every notebook on another target in make test
@pytest.mark.parametrize("name", ["05_roofline", "06_ngram_drafts"])
def test_a_notebook_with_a_target_parameter_runs_on_another_target(name, tmp_path, monkeypatch):
    """Notebooks 05 and 06 with ``target``: a tiny Qwen2 where the smoke profile says Gemma-3 (notebook 05's
    llama.cpp curve skipped in one line: no GGUF file); their results name it."""
    monkeypatch.setattr("specnb.study.notebooks.figures_for", lambda profile: tmp_path / "figures")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    [run] = run_notebooks("smoke", [name], output_dir=tmp_path, parameters={"target": "tiny-qwen2"})
    assert run.error is None, run.error
    written = "".join(f.read_text() for f in (tmp_path / "figures").glob(f"{name[:2]}_*.*") if f.suffix in (".csv",
                                                                                                          ".json"))
    assert "tiny-qwen2" in written and "tiny-gemma3" not in written
