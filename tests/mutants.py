"""A mutation run over specnb: does the test suite catch one-line bugs that change output tokens, the draft model's
cache, what a drafter drafts, or what a store, a build or the bench records?

Run it as a script, not through pytest (it holds no tests); ``make mutants`` runs it all and writes the record::

    .venv/bin/python tests/mutants.py --out docs/mutants.md   # every mutant; the record (header, table, summary)
    .venv/bin/python tests/mutants.py --only NAME     # one mutant (repeat --only for several)
    .venv/bin/python tests/mutants.py --baseline      # every selection on the unmutated copy (must pass)
    .venv/bin/python tests/mutants.py --list          # the mutants and their selections (no tests run)

Each mutant is one exact snippet of a file under ``specnb/`` and its replacement. For each, the runner copies the
repository's ``specnb/``, ``tests/``, ``data/`` and ``pyproject.toml`` into a scratch folder (``SPECNB_MUTANTS_DIR``,
default ``/tmp/specnb_mutants``), applies the mutant there (failing loudly unless the snippet occurs exactly once)
and runs the mutant's pytest selection on that copy with ``PYTHONPATH`` pointing at it, so the copy's ``specnb``
shadows the editable install (checked before every run). ``/work/.../specnb`` itself is never written.

The copy always lives at the same path, and its kernel extension is built into a ``kernels`` folder of its own
(every other entry of ``$SPECNB_CACHE`` is linked): the extension's build is keyed by its source path, so a copy
elsewhere would rebuild it, once, and never touch the build the repository's own runs load.

Verdicts: *caught* when the selection fails (the failing test is listed, with the exception where it is not an
assertion), *survived* when it passes, *timeout* when it runs past ``TIMEOUT`` seconds (a hang: not a catch, since
no test said what is wrong), *error* when pytest itself could not run the selection. Mutants marked ``equivalent``
change neither the output tokens nor the draft's cache nor anything a test may check (only work done, or a path the
tests' models never take), each for the ``reason`` it gives; they are listed to show what the run does not count.
Every other mutant must be caught. ``--list`` checks every snippet and that every selection collects.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("specnb", "tests", "data", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".hypothesis", ".pytest_cache")
TIMEOUT = 240  # seconds per mutant (every selection passes in under a minute unmutated); past it: "timeout"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # under specnb/
    old: str  # must occur exactly once in the file
    new: str
    what: str  # what it changes, in words
    tests: tuple[str, ...]  # the pytest selection expected to catch it
    equivalent: bool = False  # changes neither tokens nor the draft's cache nor anything tested
    reason: str = ""  # why, for an equivalent mutant (required there, and only there)


# Selections: the targeted fast tests (each well under a minute on its own).
VERIFY = "tests/test_verify.py"
KV = "tests/test_kv_cache.py"
LOSSLESS = "tests/test_lossless.py"
DEEP = "tests/test_lossless.py::test_deep_and_wide_trees"
MAXNEW = "tests/test_lossless.py::test_never_exceeds_max_new_tokens"
EOS = "tests/test_lossless.py::test_eos_accepted_mid_block"
FAMILIES = "tests/test_families_lossless.py"
DRAFT_CACHE = "tests/test_draft_cache.py"
SAMPLING = "tests/test_sampling.py"
POSITIONS = "tests/test_sampling_positions.py"
KERNELS = "tests/test_kernels.py"
DECODER = "tests/test_decoder.py"

REST = "tests/test_rest.py"
CREST_COUNTS = "tests/test_crest.py::test_ngram_counts_match_brute_force"
LEVEL_WALK = "tests/test_verify.py::test_greedy_acceptance_by_levels_matches_the_rule_over_all_rows"
PROBABILITIES = "tests/test_sampling_deterministic.py::test_probabilities_equal_an_independent_computation"
MCNS_WALK = "tests/test_sampling.py::test_accept_mcss_tree_walk_matches_target_distribution[mcns]"
ATOMIC_SYNC = "tests/test_datastores.py::test_atomic_writes_reach_the_disk_before_their_rename[renameat2]"
ATOMIC_FAILURE = "tests/test_datastores.py::test_atomic_helpers_leave_the_old_version_on_failure"
SHARD_RESUME = "tests/test_ray_builds.py::test_a_rerun_sends_to_ray_only_the_shards_not_on_disk"
ROWS_READ = "tests/test_replay.py::test_a_replayed_call_records_the_rows_greedy_acceptance_reads"
HEAD_PRICE = "tests/test_roofline.py::test_a_replayed_call_pays_for_the_head_rows_its_acceptance_read"
HEAD_TABLE = "tests/test_roofline.py::test_a_roofline_table_times_the_head_alone_beside_its_calls"
SHAPE_ROWS = "tests/test_mcsd_shapes.py::test_teacher_forced_draft_replay_equals_the_drafters_replay"
INT8_STEPS = "tests/test_quant_int8.py::test_the_tiles_take_these_fp32_steps_on_every_path"


def family(case: str) -> str:
    """One case of the families test, by its id (family-arch-path-dtype-mode): greedy output equals AR's and
    drafts were accepted (tokens per call > 1), so a drafter that stops drafting fails it. The ``torch`` path
    (PyTorch's ops) is the one every machine has."""
    return f"tests/test_families_lossless.py::test_every_family_is_lossless_and_accepts[{case}]"

MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------ datastores: sharded REST, CREST counts
    Mutant("rest-shards-concatenated", "datastores/rest.py",
           "return rows[np.lexsort(ended_last.T[::-1])[:max_matches]]",
           "return rows[:max_matches]",
           "a sharded store's continuations taken shard after shard, not in one suffix array's order", (REST,)),
    Mutant("rest-shard-end-is-a-token", "datastores/rest.py",
           "ended_last = np.where(rows < 0, np.iinfo(np.int64).max, rows)",
           "ended_last = rows",
           "over shards, a document's end sorts before every token (one suffix array sorts it after)", (REST,)),
    Mutant("crest-shard-counts-not-summed", "datastores/crest.py",
           "return keys[starts], np.add.reduceat(counts, starts)",
           "return keys[starts], counts[starts]",
           "an n-gram's count over shards is its first shard's, not the sum", (CREST_COUNTS,)),
    # ------------------------------------------------------------------ accept.py
    Mutant("greedy-bonus-from-parent-row", "core/accept.py",
           "last = int(nodes[-1]) + 1 if nodes.numel() else 0",
           "last = int(nodes[-1]) if nodes.numel() else 0",
           "greedy bonus read from the last accepted node's parent row (off by one)", (VERIFY, DEEP)),
    Mutant("greedy-level-walk-reads-parent-row", "core/accept.py",
           "rows = torch.nonzero(passing).squeeze(1) + 1",
           "rows = torch.nonzero(passing).squeeze(1)",
           "the CPU's level walk reads a passing node's parent row for the next level (walks a level again, or "
           "the wrong node's children)", (LEVEL_WALK,)),
    Mutant("greedy-accepts-orphans", "core/accept.py",
           "depth = torch.where(path_accepted(draft, ok), draft.depth, 0)",
           "depth = torch.where(ok, draft.depth, 0)",
           "a node passes though an ancestor failed (one node too many on an accelerator's all-rows test)",
           (VERIFY,)),
    Mutant("path-accepted-child-of-node-0", "core/accept.py",
           "out[i] = parent < 0 or out[parent]",
           "out[i] = parent <= 0 or out[parent]",
           "children of node 0 pass as if node 0 were the root (off by one)", (VERIFY,)),
    Mutant("greedy-accepts-nothing", "core/accept.py",
           "nodes = longest_path(draft, ok)",
           "nodes = NO_NODES",
           "greedy accepts nothing (tokens stay AR's; every call is root-only)", (FAMILIES,)),
    Mutant("greedy-accepts-every-child", "core/accept.py",
           "passing = torch.isin(parent_rows, rows) & (draft.tokens == predicted[parent_rows])",
           "passing = torch.isin(parent_rows, rows)",
           "greedy accepts every drafted child, matching or not", (VERIFY, DEEP)),
    Mutant("sampled-walk-draws-at-parent", "core/accept.py",
           "        nodes.append(node)\n        current = node + 1",
           "        nodes.append(node)\n        current = node",
           "sampled walk draws the next token at the accepted node's parent", (POSITIONS,)),
    Mutant("sampled-accepts-first-child", "core/accept.py",
           "children = torch.nonzero((draft.parents + 1 == current) & (draft.tokens == token))",
           "children = torch.nonzero(draft.parents + 1 == current)",
           "sampled walk accepts the first child whatever the target drew", (POSITIONS,)),
    Mutant("mcss-wor-removal-skipped", "core/accept.py",
           "q = torch.where(reject, _normalise(q.scatter(1, x[:, None], 0.0), q), q)",
           "q = torch.where(reject, _normalise(q, q), q)",
           "MCSS without replacement: a rejected candidate stays in q", (SAMPLING,)),
    Mutant("mcss-wor-verified-with-replacement", "core/accept.py",
           'replacement=scheme == "mcss")',
           "replacement=True)",
           "candidates drawn without replacement verified as if drawn with it", (SAMPLING, POSITIONS)),
    Mutant("mcss-residual-is-p", "core/accept.py",
           "p = torch.where(reject, _normalise((p - q).clamp(min=0), p), p)",
           "p = torch.where(reject, _normalise(p, p), p)",
           "MCSS residual max(p - q, 0) replaced by p", (SAMPLING,)),
    Mutant("mcss-residual-unnormalised", "core/accept.py",
           "return torch.where(ok, weights / torch.where(ok, total, 1.0), fallback)",
           "return torch.where(ok, weights, fallback)",
           "residual and q not renormalised after a rejection", (SAMPLING,)),
    Mutant("mcss-ratio-inverted", "core/accept.py",
           "take = open_ & (u[:, i] * qx < px)",
           "take = open_ & (u[:, i] * px < qx)",
           "candidate accepted with probability min(1, q/p) instead of min(1, p/q)", (SAMPLING,)),
    Mutant("mcss-q-of-last-sibling", "core/accept.py",
           "q = draft.q[children[0]]",
           "q = draft.q[children[-1]]",
           "q read from the last sibling instead of the first", (SAMPLING, POSITIONS), equivalent=True,
           reason="siblings share one q (CandidateDraft: q[i] is what node i's sibling group was drawn from)"),
    # ------------------------------------------------------------------ head_rows.py
    Mutant("head-rows-rest-shifted", "core/head_rows.py",
           "self._parts.append(self.head(self.hidden[done:stop]))",
           "self._parts.append(self.head(self.hidden[max(done - 1, 0):stop - 1] if done else self.hidden[:stop]))",
           "the head's second call computes each row from the hidden state one position earlier", (VERIFY,)),
    Mutant("head-rows-first-call-ignores-the-read", "core/head_rows.py",
           "stop = min(max(end, self.first), len(self)) if done == 0 else len(self)",
           "stop = min(self.first, len(self)) if done == 0 else len(self)",
           "the first head call stops at the measured rows even when the first read asks for more", (VERIFY,)),
    Mutant("head-rows-all-rows-ignored", "core/head_rows.py",
           "if all_rows or len(hidden) == 1",
           "if len(hidden) == 1",
           "priced cuts split their head like any draft", (VERIFY,)),
    Mutant("head-seconds-counted-as-overhead", "core/generate.py",
           "verify_seconds=t2 - t1 + result.logits.seconds",
           "verify_seconds=t2 - t1",
           "the head's seconds during acceptance are left out of verification", (VERIFY,)),
    # ------------------------------------------------------------------ replayed prices of the head's rows
    Mutant("replay-reads-the-accepted-path-only", "eval/replay.py",
           "rows_read = int(passing[-1]) + 2 if passing.size else 1",
           "rows_read = int(nodes[-1]) + 2 if accepted else 1",
           "a replayed call's rows read leave out a passing duplicate sibling's", (ROWS_READ,)),
    Mutant("shape-replay-reads-the-first-sibling", "experiments/shapes.py",
           "at = at * shape[accepted] + int(rank[pos + 1 + accepted])",
           "at = at * shape[accepted]",
           "a draft-model replay places every accepted node first in its sibling group", (SHAPE_ROWS,)),
    Mutant("head-price-second-call-at-the-first-rows", "core/roofline.py",
           "if rows_read > self.head_first:",
           "if rows_read >= self.head_first:",
           "a call read up to its first rows is priced with the head's second call", (HEAD_PRICE,)),
    Mutant("head-price-left-out", "eval/replay.py",
           "seconds += cost.seconds_at(k, w, int(ell)) + cost.head_correction(",
           "seconds += cost.seconds_at(k, w, int(ell)) + 0 * cost.head_correction(",
           "a replayed call is priced with every row of its head", (HEAD_PRICE,)),
    Mutant("head-curve-never-timed", "eval/timing.py",
           "if splits(head, hidden) else []",
           "if False else []",
           "a roofline table of a path whose head splits its rows holds no head curve", (HEAD_TABLE,)),
    # ------------------------------------------------------------------ verify.py
    Mutant("verify-keeps-first-entries", "core/verify.py",
           "self.cache.keep(self._past + 1, self._past + 1 + accepted)",
           "self.cache.keep(self._past + 1, self._past + 1 + torch.arange(accepted.shape[0]))",
           "tree mode keeps the call's first a entries: KV of rejected nodes kept", (VERIFY,)),
    Mutant("verify-drops-root", "core/verify.py",
           "self.cache.keep(self._past + 1, self._past + 1 + accepted)",
           "self.cache.keep(self._past, self._past + 1 + accepted)",
           "tree mode drops the root's KV entry (keep starts one early)", (VERIFY,)),
    Mutant("verify-positions-by-index", "core/verify.py",
           "positions = past + depth",
           "positions = past + torch.arange(depth.shape[0])",
           "tree nodes get position ids by node index, not depth", (VERIFY,)),
    Mutant("verify-positions-off-by-one", "core/verify.py",
           "positions = past + depth",
           "positions = past + depth + 1",
           "tree nodes' position ids one too large", (VERIFY,)),
    Mutant("verify-causal-tree-mask", "core/verify.py",
           "mask = self.masks(visible, positions, positions, prefix=past)",
           "mask = self.masks(torch.ones_like(visible).tril(), positions, positions, prefix=past)",
           "tree mode: a node sees every earlier node (siblings and their subtrees)", (VERIFY,)),
    Mutant("verify-batch-drops-last-accepted", "core/verify.py",
           "self.cache.keep_row(_row_of(self._paths, accepted), 1 + accepted.shape[0])",
           "self.cache.keep_row(_row_of(self._paths, accepted), accepted.shape[0])",
           "batch mode keeps one entry too few of the accepted row", (VERIFY,)),
    Mutant("verify-batch-wrong-row", "core/verify.py",
           "return int(torch.nonzero((prefix == accepted[None] + 1).all(1))[0])",
           "return int(torch.nonzero((prefix == accepted[None] + 1).any(1))[0])",
           "batch mode keeps the first row sharing any accepted node, not the whole path", (VERIFY,)),
    Mutant("verify-batch-last-path", "core/verify.py",
           'reduce="amin"',
           'reduce="amax", include_self=False',
           "batch mode reads each node's logits from the last path holding it, not the first", (VERIFY, DEEP),
           equivalent=True,
           reason="every path holding a node holds the same tokens before it, and causal attention reads only "
                  "those: test_verify's fresh-call comparison of every node's logits passes in batch mode"),
    # ------------------------------------------------------------------ masks.py
    Mutant("mask-window-one-wider", "model/masks.py",
           "keys[None, :] <= query_pos[:, None] - self.sliding_window",
           "keys[None, :] < query_pos[:, None] - self.sliding_window",
           "sliding-window layers see one key too many", (VERIFY,)),
    Mutant("mask-cache-positions-off-by-one", "model/masks.py",
           "keys = torch.cat([torch.arange(prefix, device=self.device), key_pos])",
           "keys = torch.cat([torch.arange(1, prefix + 1, device=self.device), key_pos])",
           "cached keys' positions one too large in the sliding-window test", (VERIFY,)),
    Mutant("mask-node-sees-sibling", "model/masks.py",
           "mask[:, prefix:].masked_fill_(~allowed, blocked)",
           "mask[:, prefix:].masked_fill_(~(allowed | allowed.roll(1, 0)), blocked)",
           "a tree node also sees what the node before it sees (its previous sibling)", (VERIFY,)),
    # ------------------------------------------------------------------ kv_cache.py
    Mutant("cache-crop-one-long", "model/kv_cache.py",
           "layer.truncate(start + m)",
           "layer.truncate(start + m + 1)",
           "a crop keeps one rejected entry", (KV, VERIFY)),
    Mutant("cache-compaction-off-by-one", "model/kv_cache.py",
           "on_device = sources.to(layers[0].key_buffer.device) if layers else sources",
           "on_device = (sources - 1).to(layers[0].key_buffer.device) if layers else sources",
           "a compaction gathers the entries one slot early", (KV, VERIFY)),
    Mutant("cache-compaction-taken-for-crop", "model/kv_cache.py",
           "if m == 0 or bool((sources == torch.arange(start, start + m)).all()):",
           "if m == 0 or bool((sources == torch.arange(start, start + m)).any()):",
           "entries that are not a prefix are cropped instead of compacted", (KV, VERIFY)),
    Mutant("cache-keep-row-0", "model/kv_cache.py",
           "self._write(self.get_seq_length(), keys[row:row + 1, :, :count], values[row:row + 1, :, :count])",
           "self._write(self.get_seq_length(), keys[0:1, :, :count], values[0:1, :, :count])",
           "batch mode keeps the first row's entries, not the accepted row's", (KV, VERIFY)),
    Mutant("cache-regrow-drops-entry", "model/kv_cache.py",
           "grown[:, :, :length] = buffer[:, :, :length]",
           "grown[:, :, :length - 1] = buffer[:, :, :length - 1]",
           "a regrown buffer loses the last kept entry", (KV, VERIFY)),
    Mutant("cache-always-truncate", "model/kv_cache.py",
           "if self.get_seq_length() != start + m:",
           "if True:",
           "a crop to the current length is done anyway", (KV, VERIFY), equivalent=True,
           reason="truncating a layer to the length it has is a view of the same entries"),
    # ------------------------------------------------------------------ draft.py
    Mutant("draft-ancestors-parent-off-by-one", "core/draft.py",
           "parent_full = np.concatenate([[0], self.parents.numpy() + 1])",
           "parent_full = np.concatenate([[0], np.maximum(self.parents.numpy(), 0)])",
           "tree attention built from parent indices off by one", (VERIFY,)),
    Mutant("draft-attention-depth-from-one", "core/draft.py",
           "return anc, anc.sum(1) - 1",
           "return anc, anc.sum(1)",
           "tree depths (position offsets) counted from 1", (VERIFY,)),
    Mutant("draft-depth-flat", "core/draft.py",
           "depth.append(1 if parent < 0 else depth[parent] + 1)",
           "depth.append(1 if parent < 0 else depth[parent])",
           "every node has depth 1 (truncation and longest path wrong)", (MAXNEW, VERIFY, FAMILIES)),
    Mutant("draft-every-tree-a-chain", "core/draft.py",
           "return bool((self.parents == torch.arange(self.num_nodes) - 1).all())",
           "return bool((self.parents < torch.arange(self.num_nodes)).all())",
           "every tree is taken for a chain (plain causal call)", (VERIFY,)),
    Mutant("draft-leaves-off-by-one", "core/draft.py",
           "has_child[self.parents + 1] = True",
           "has_child[self.parents] = True",
           "batch mode's paths built from the wrong leaves", (VERIFY,)),
    Mutant("draft-truncate-one-deeper", "core/draft.py",
           "keep = depth <= max_depth  # a new array",
           "keep = depth <= max_depth + 1  # a new array",
           "truncation keeps one level too many (max_new_tokens overshoot)", (MAXNEW,)),
    # --------------------------------------------------------- core/generate.py
    Mutant("decode-bonus-dropped", "core/generate.py",
           "committed = torch.cat([draft.tokens[acceptance.nodes], torch.tensor([acceptance.bonus])])",
           "committed = draft.tokens[acceptance.nodes] if acceptance.nodes.numel() else "
           "torch.tensor([acceptance.bonus])",
           "the bonus token is dropped after an accepted draft", (DEEP,)),
    Mutant("decode-stop-off-by-one", "core/generate.py",
           "while stop_reason != \"eos\" and length - prompt_ids.shape[0] < max_new_tokens:",
           "while stop_reason != \"eos\" and length - prompt_ids.shape[0] < max_new_tokens - 1:",
           "decoding stops one token early", (MAXNEW,)),
    Mutant("decode-overshoot", "core/generate.py",
           "draft = Draft.empty() if draft is None else draft.truncate(remaining - 1)",
           "draft = Draft.empty() if draft is None else draft.truncate(remaining)",
           "drafts may run one token past max_new_tokens", (MAXNEW,)),
    Mutant("decode-root-is-first", "core/generate.py",
           "root = int(committed[-1])",
           "root = int(committed[0])",
           "the next root is the first committed token, not the last", (DEEP,)),
    Mutant("decode-eos-dropped", "core/generate.py",
           "committed = committed[:int(hits[0]) + 1]",
           "committed = committed[:int(hits[0])]",
           "an EOS accepted mid-block is dropped", (EOS,)),
    # ------------------------------------------------------------------ drafters/draft_model.py
    Mutant("dm-slots-ignore-earlier-levels", "drafters/draft_model.py",
           "slots[-1][first] = self.prefix + sum(f.shape[0] for f in fed) + torch.arange(frontier.shape[0])",
           "slots[-1][first] = self.prefix + torch.arange(frontier.shape[0])",
           "draft cache slots of deeper levels point at the first level's", (DRAFT_CACHE,)),
    Mutant("dm-prefix-counts-unfed-leaf", "drafters/draft_model.py",
           "        self.prefix += fed\n",
           "        self.prefix += slots.shape[0]\n",
           "the draft counts an accepted leaf it never computed as cached", (DRAFT_CACHE,)),
    Mutant("dm-keeps-one-slot-too-few", "drafters/draft_model.py",
           "self.cache.keep(self.prefix, slots[:fed])",
           "self.cache.keep(self.prefix, slots[:max(fed - 1, 0)])",
           "the draft cache drops the deepest computed accepted node", (DRAFT_CACHE,)),
    Mutant("dm-query-position-off-by-one", "drafters/draft_model.py",
           "query_pos = context - 1 + depth[frontier]",
           "query_pos = context + depth[frontier]",
           "draft tree calls at positions one too large", (DRAFT_CACHE,)),
    Mutant("dm-level0-skips-a-token", "drafters/draft_model.py",
           "pending = state.tokens[self.prefix:]",
           "pending = state.tokens[self.prefix + 1:]",
           "the draft's catch-up call skips the first unseen token", (DRAFT_CACHE,)),
    Mutant("dm-node-sees-cousins", "drafters/draft_model.py",
           "mask = self.masks(ancestors[frontier][:, key_nodes], query_pos,",
           "mask = self.masks(torch.ones_like(ancestors[frontier][:, key_nodes]), query_pos,",
           "a draft tree node sees every fed node, not just its ancestors", (DRAFT_CACHE,)),
    Mutant("dm-q-tiled-not-interleaved", "drafters/draft_model.py",
           "qs.append(q.repeat_interleave(k, 0))",
           "qs.append(q.repeat(k, 1))",
           "each candidate carries the q of another frontier node", (DRAFT_CACHE, POSITIONS)),
    Mutant("dm-parents-tiled", "drafters/draft_model.py",
           "parents.append(frontier.repeat_interleave(k))",
           "parents.append(frontier.repeat(k))",
           "candidates hung under the wrong frontier nodes", (DRAFT_CACHE, POSITIONS)),
    Mutant("dm-draws-without-temperature", "drafters/draft_model.py",
           "return torch.multinomial(q, k, replacement=with_replacement, generator=self.generator).cpu(), q",
           "return torch.multinomial(logits.float().softmax(-1), k, replacement=with_replacement, "
           "generator=self.generator).cpu(), q",
           "candidates drawn at temperature 1, q reported at the draft's temperature", (DRAFT_CACHE, POSITIONS)),
    Mutant("dm-expands-every-copy", "drafters/draft_model.py",
           "first = ~((children[:, :, None] == children[:, None, :]) & _earlier(k)).any(-1).flatten()",
           "first = torch.ones(m * k, dtype=torch.bool)",
           "repeated siblings are expanded too", (DRAFT_CACHE, family("mcsd-duplicates-llama-torch-fp32-tree")),
           equivalent=True,
           reason="a later copy's subtree repeats the first copy's tokens and acceptance takes the first child "
                  "holding a token: only draft work is wasted"),
    Mutant("dm-key-positions-off-by-one", "drafters/draft_model.py",
           "mask = self.masks(ancestors[frontier][:, key_nodes], query_pos, context - 1 + depth[key_nodes],",
           "mask = self.masks(ancestors[frontier][:, key_nodes], query_pos, context + depth[key_nodes],",
           "tree keys' positions one too large in the sliding-window test", (DRAFT_CACHE,), equivalent=True,
           reason="key positions enter only the window test, and a draft tree is far shallower than any window"),
    # ------------------------------------------------------------------ kernels/__init__.py (Python side)
    Mutant("kernels-max-rows-zero", "model/kernels/__init__.py",
           "MAX_ROWS = 256 ",
           "MAX_ROWS = 0 ",
           "every linear call goes to PyTorch's GEMM (rows no longer bit-independent)", (KERNELS, DECODER)),
    Mutant("kernels-prefill-rows-to-kernel", "model/kernels/__init__.py",
           "x.numel() // x.shape[-1] <= MAX_ROWS",
           "x.numel() // x.shape[-1] >= MAX_ROWS",
           "routing inverted: few-row calls to PyTorch, prefills to the kernel", (KERNELS, DECODER)),
    Mutant("kernels-bool-mask-inverted", "model/kernels/__init__.py",
           "attention_mask = torch.zeros(attention_mask.shape).masked_fill_(~attention_mask, float(\"-inf\"))",
           "attention_mask = torch.zeros(attention_mask.shape).masked_fill_(attention_mask, float(\"-inf\"))",
           "bool masks converted with True = blocked", (KERNELS,)),
    Mutant("kernels-scaling-ignored", "model/kernels/__init__.py",
           "scale = scaling if scaling is not None else query.shape[-1] ** -0.5",
           "scale = query.shape[-1] ** -0.5",
           "the model's attention scaling ignored", (KERNELS, DECODER)),
    Mutant("kernels-softcap-ignored", "model/kernels/__init__.py",
           "float(softcap or 0.0)",
           "0.0",
           "attention logit softcapping ignored", (KERNELS, DECODER)),
    Mutant("decoder-siblings-share-slice", "model/decoder.py",
           "        start += size\n",
           "",
           "stacked q/k/v (gate/up) projections all get the first sibling's weight", (KERNELS, DECODER)),
    # ------------------------------------------------------------------ core/sampling.py, MCNS
    Mutant("sampling-temperature-ignored", "core/sampling.py",
           "probs = torch.softmax(logits.float() / config.temperature, dim=-1)",
           "probs = torch.softmax(logits.float(), dim=-1)",
           "the target samples at temperature 1 whatever the temperature", (PROBABILITIES,)),
    Mutant("sampling-top-p-drops-crossing-token", "core/sampling.py",
           "before = sorted_probs.cumsum(-1) - sorted_probs",
           "before = sorted_probs.cumsum(-1)",
           "top-p drops the token whose probability crosses the threshold (the set falls short of top_p)",
           (PROBABILITIES,)),
    Mutant("mcns-accepts-a-different-candidate", "core/accept.py",
           "hit = torch.nonzero(tokens == token).squeeze(1)",
           "hit = torch.nonzero(tokens != token).squeeze(1)",
           "MCNS accepts a candidate other than the token the target drew", (MCNS_WALK,)),
    # ------------------------------------------------------------------ drafters (model-free)
    Mutant("pld-skips-first-continuation-token", "drafters/context.py",
           "for begin in (starts + q).tolist():",
           "for begin in (starts + q + 1).tolist():",
           "prompt lookup's drafts start one token after what followed the match", (
               "tests/test_errors_and_cli.py::test_context_ngram_ranks_by_count_then_recency",)),
    Mutant("bigram-never-drafts", "drafters/model_ngram.py",
           "return None if rows is None else Draft.from_rows(rows)",
           "return None",
           "the model bigram drafter stops proposing", (family("ngram-bigram-gemma3-torch-fp32-tree"),)),
    Mutant("mixed-bigram-fills-only-empty-context", "drafters/mixed.py",
           "if bigram is not None and n_context < k:",
           "if bigram is not None and n_context == 0:",
           "the bigram fills the batch only where the context found nothing (k rows left short)",
           ("tests/test_mixed.py::test_context_rows_first_then_bigram_without_duplicates",)),
    Mutant("adaptive-picks-the-worst-shape", "drafters/mixed.py",
           "best = int(np.argmax(rate))",
           "best = int(np.argmin(rate))",
           "the adaptive shape is the one of the lowest expected tokens/s",
           ("tests/test_mixed.py::test_adaptive_chooser_picks_the_hand_computed_shape",)),
    Mutant("rest-query-leaves-out-the-root", "drafters/rest.py",
           "context = state.tokens[-self.config.max_query:].numpy()",
           "context = state.tokens[-self.config.max_query - 1:-1].numpy()",
           "REST matches the context before the root: its drafts continue the wrong token",
           ("tests/test_rest.py::test_rest_drafter_greedy_lossless[tree]",)),
    Mutant("crest-ngram-ends-before-the-root", "drafters/crest.py",
           "self.store.lookup(state.tokens[-self.store.ns[0]:].numpy())",
           "self.store.lookup(state.tokens[-self.store.ns[0] - 1:-1].numpy())",
           "CREST looks up the n-gram ending one token before the root: its tree continues the wrong token",
           ("tests/test_crest.py::test_crest_drafter_greedy_lossless",)),
    Mutant("dense-draft-repeats-the-root", "drafters/dense.py",
           "rows = values[values[:, 0] == root, 1:1 + w].astype(np.int64)",
           "rows = values[values[:, 0] == root, :w].astype(np.int64)",
           "DReSD's drafts start with the root token itself, not the tokens after it",
           ("tests/test_dense.py::test_first_token_filter_shapes_and_dedup",)),
    Mutant("priced-budget-scored-by-its-last-node", "drafters/priced.py",
           "best = np.maximum.accumulate(np.where(matched, depth, 0))",
           "best = np.where(matched, depth, 0)",
           "a budget's counterfactual acceptance is its last node's, not the best of its first b nodes",
           ("tests/test_priced.py::test_accepted_length_of_every_node_prefix",)),
    Mutant("suffix-ignores-earlier-requests", "drafters/suffix.py",
           "q = max(q_request, q_history)",
           "q = q_request",
           "SuffixDecoding never drafts from earlier requests' outputs",
           ("tests/test_suffix.py::test_earlier_outputs_are_drafted_from_in_the_next_request",)),
    Mutant("recycle-children-under-wrong-parents", "drafters/recycle.py",
           "level, level_index = tokens[-1], count + np.arange(parent.size)",
           "level, level_index = tokens[-1], np.arange(parent.size)",
           "Token Recycling hangs the third level and below under nodes of the first",
           ("tests/test_recycle.py::test_tree_follows_the_table_best_paths_first",)),
    Mutant("auto-takes-the-worst-offer", "drafters/auto.py",
           "offers.sort(key=lambda offer: -offer[0])",
           "offers.sort(key=lambda offer: offer[0])",
           "the router verifies the member of the lowest expected tokens/s",
           ("tests/test_auto.py::test_a_runner_up_that_adds_nothing_is_not_merged",)),
    # ------------------------------------------------------------------ GGUF and quantized weights (Python side)
    Mutant("gguf-tensor-data-unaligned", "model/gguf_file.py",
           "start = -(-cursor.pos // alignment) * alignment",
           "start = cursor.pos",
           "tensor data read from the header's end, not from the next aligned offset",
           ("tests/test_gguf_weights.py::test_the_header_reader_reads_what_the_gguf_package_reads",)),
    Mutant("gguf-sliding-layers-at-global-base", "model/gguf_weights.py",
           'rope_base["sliding_attention"] = float(value("{arch}.rope.freq_base_swa", GEMMA_SWA_BASE))',
           'rope_base["sliding_attention"] = base',
           "Gemma's sliding layers rotate at the global layers' rotary base",
           ("tests/test_gguf_weights.py::test_a_tiny_model_over_blocks_computes_the_stock_model_of_their_values"
            "[gemma3]",)),
    Mutant("quant-bias-dropped", "model/kernels/quant.py",
           "block_linear(flat, blocks, FORMATS[weight.format][0], bias, path)",
           "block_linear(flat, blocks, FORMATS[weight.format][0], None, path)",
           "a linear layer over blocks drops its bias (Qwen2's q/k/v)",
           ("tests/test_quant.py::test_linear_matches_an_fp32_matmul_of_the_dequantized_weight",)),
    # ------------------------------------------------------------------ the int8 route's AVX2 tiles (a rebuild each)
    Mutant("int8-avx2-q8-sign-dropped", "model/kernels/csrc/quant_int8.h",
           "      if constexpr (sign) x = _mm256_sign_epi8(x, codes);\n",
           "",
           "Q8_0's AVX2 step multiplies x by the codes' magnitudes, without their signs", (INT8_STEPS,)),
    Mutant("int8-round-truncates", "model/kernels/csrc/quant_int8.h",
           "_mm256_store_si256(reinterpret_cast<__m256i*>(qi), _mm256_cvtps_epi32(",
           "_mm256_store_si256(reinterpret_cast<__m256i*>(qi), _mm256_cvttps_epi32(",
           "activations rounded to int8 toward zero, not to nearest even (AVX2 rounding)", (INT8_STEPS,)),
    Mutant("int8-avx2-block-scaled-in-two-roundings", "model/kernels/csrc/quant_int8.h",
           "acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][m]), _mm256_mul_ps(d, _mm256_set1_ps(dxb[m])),\n"
           "                                      acc[i][m]);",
           "acc[i][m] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot[i][m]), "
           "_mm256_mul_ps(d, _mm256_set1_ps(dxb[m]))),\n                                      acc[i][m]);",
           "a Q8_0 / Q5_0 block's scaled dot added in two roundings, not one fused multiply-add", (INT8_STEPS,),
           equivalent=True, reason="GCC contracts the separate multiply and add back into one fused multiply-add "
                                   "(-ffp-contract=fast, its default for GNU C++): the same instructions"),
    Mutant("int8-avx2-q4k-mins-dropped", "model/kernels/csrc/quant_int8.h",
           "            acc[i][m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dxm), acc[i][m]);\n",
           "",
           "Q4_K's AVX2 tiles leave out the blocks' mins", (INT8_STEPS,)),
    Mutant("int8-avx2-q6k-offset-dropped", "model/kernels/csrc/quant_int8.h",
           "_mm256_mullo_epi32(sc32, _mm256_set1_epi32(sums[(b * G + g) * mb + m]))",
           "_mm256_setzero_si256()",
           "Q6_K's AVX2 tiles leave out the codes' offset of 32", (INT8_STEPS,)),
    # ------------------------------------------------------------------ the attention kernel (a rebuild)
    Mutant("attention-window-starts-one-late", "model/kernels/csrc/attention.cpp",
           "  while (j < S && !(mrow[j * ms] > -1e30f)) j++;\n  return j;",
           "  while (j < S && !(mrow[j * ms] > -1e30f)) j++;\n  return j + 1;",
           "attention reads a masked call's keys from one after the first that any of its rows sees",
           ("tests/test_kernels.py::test_attention_query_gives_the_bits_it_gives_alone",)),
    # ------------------------------------------------------------------ the blocks' default, head rows, cost floors
    Mutant("weights-blocks-faster-at-any-size", "model/weights_choice.py",
           "(seconds[blocks] <= seconds[\"bf16\"]).all()",
           "(seconds[blocks] <= seconds[\"bf16\"]).any()",
           "weights=auto takes the blocks where they are no slower at one call size, not at all of them",
           ("tests/test_gguf_weights.py::test_the_blocks_are_chosen_only_where_no_call_of_speculation_is_slower",)),
    Mutant("head-first-rows-fewest", "core/head_rows.py",
           "return max(rows for rows, s in seconds.items() if s <= limit)",
           "return min(rows for rows, s in seconds.items() if s <= limit)",
           "the head's first read computes one row, not the most at about one row's price",
           ("tests/test_verify.py::test_the_head_computes_as_many_rows_together_as_cost_one_rows_price",)),
    Mutant("int8-priced-at-fp32-fmas", "model/ceilings.py",
           "return (\"int8-vnni\" if avx512 else \"int8-avx2\") if int8 else \"fp32-fma\"",
           "return \"fp32-fma\"",
           "the int8 route's compute floor is taken at fp32 FMAs, not its integer instruction",
           ("tests/test_bench_limits.py::test_each_kernel_path_is_priced_at_the_instruction_it_multiplies_with",)),
    Mutant("roofline-retimes-one-of-a-pair", "eval/timing.py",
           "out |= {less, more}",
           "out |= {less}",
           "of two cells where more work costs less, only the one doing less work is timed again",
           ("tests/test_roofline.py::test_a_cell_that_cannot_be_true_among_the_others_is_timed_again",)),
    # ------------------------------------------------------------------ atomic writes, store checksums, resume
    Mutant("atomic-file-renamed-before-fsync", "atomic.py",
           "        _sync(tmp)\n        os.replace(tmp, path)\n",
           "        os.replace(tmp, path)\n        _sync(path)\n",
           "a file is renamed into place before it reaches the disk (a power cut may publish it empty)",
           (ATOMIC_SYNC,)),
    Mutant("atomic-folder-files-not-synced", "atomic.py",
           "_sync_tree(tmp)",
           "_sync(tmp)",
           "a new folder is renamed into place with only itself flushed, not the files in it", (ATOMIC_SYNC,)),
    Mutant("atomic-folder-published-on-failure", "atomic.py",
           "        except BaseException:\n",
           "        except BaseException:\n            _swap_in(tmp, path)\n",
           "a folder whose build failed replaces the old one anyway", (ATOMIC_FAILURE,)),
    Mutant("manifest-full-hash-skipped", "datastores/manifest.py",
           'if sampled_hash(path) != record["sample_sha256"] or (full and full_hash(path) != record["sha256"]):',
           'if sampled_hash(path) != record["sample_sha256"]:',
           "datastore verify checks only the sampled chunks, not every byte",
           ("tests/test_interrupts.py::test_full_verify_sees_damage_outside_the_sampled_chunks",)),
    Mutant("manifest-meta-checksum-skipped", "datastores/manifest.py",
           'if "meta_sha256" in meta and meta["meta_sha256"] != meta_hash(meta):',
           "if False:",
           "a meta.json whose values were changed is trusted",
           ("tests/test_datastores.py::test_a_damaged_meta_json_is_refused_by_open_and_verify_in_one_line[value]",)),
    Mutant("shards-finished-redone", "datastores/shards.py",
           "todo = [s for s in range(count) if s not in done]",
           "todo = list(range(count))",
           "a resumed Ray extraction runs its finished shards again", (SHARD_RESUME,)),
    Mutant("shards-unfinished-skipped", "datastores/shards.py",
           "return [s for s in range(count) if shard_path(work, s).exists()]",
           "return [s for s in range(count) if shard_path(work, s).parent.exists()]",
           "every shard counts as finished once one is on disk (the rest never run)", (SHARD_RESUME,)),
    Mutant("cluster-resumes-another-corpus", "datastores/cluster.py",
           "if held != record:",
           'if held.get("params") != record["params"]:',
           "a work folder planned for another corpus (same parameters) is resumed: its pieces are reused",
           ("tests/test_ray_builds.py::test_a_partial_made_with_other_parameters_is_refused",)),
    # ------------------------------------------------------------------ the bench
    Mutant("bench-identical-to-ar-always-true", "eval/runner.py",
           'row["identical_to_ar"] = index is None',
           'row["identical_to_ar"] = True',
           "the bench reports every greedy method identical to AR, whatever its tokens",
           ("tests/test_metrics_and_id_data.py::test_identical_to_ar_says_whether_a_method_gave_the_references_tokens",)),
]


# ---------------------------------------------------------------------------------------------- runner


def scratch() -> Path:
    return Path(os.environ.get("SPECNB_MUTANTS_DIR", "/tmp/specnb_mutants"))


def cache_for_copies() -> Path:
    """A SPECNB_CACHE for the copies: links to every entry of the real one but ``kernels`` (see the docstring)."""
    real = Path(os.environ.get("SPECNB_CACHE", ROOT / ".cache")).resolve()
    cache = scratch() / "cache"
    (cache / "kernels").mkdir(parents=True, exist_ok=True)
    if real.is_dir():
        for entry in real.iterdir():
            link = cache / entry.name
            if entry.name != "kernels" and not link.exists() and not link.is_symlink():
                link.symlink_to(entry)
    return cache


def fresh_copy() -> Path:
    """The repository's files that pytest needs, copied afresh to the scratch folder's ``repo``."""
    repo = scratch() / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=IGNORED)
        elif source.exists():
            shutil.copy2(source, repo / name)
    return repo


def apply(repo: Path, mutant: Mutant) -> None:
    path = repo / "specnb" / mutant.file
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"mutant {mutant.name}: the snippet occurs {count} times in specnb/{mutant.file}, "
                         f"not once:\n{mutant.old}")
    path.write_text(text.replace(mutant.old, mutant.new))


def environment(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["COLUMNS"] = "1000"  # pytest cuts its summary lines (the failing test's message) to the terminal's width
    env["SPECNB_CACHE"] = str(cache_for_copies())
    return env


def check_shadowing(repo: Path, env: dict[str, str]) -> None:
    """The copy's specnb is the one imported (not the editable install's)."""
    out = subprocess.run([sys.executable, "-c", "import specnb; print(specnb.__file__)"], cwd=repo, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(repo.resolve()):
        raise SystemExit(f"the copy does not shadow the installed specnb: imported {out}")


@dataclass
class Outcome:
    mutant: Mutant | None
    verdict: str  # caught / survived / timeout / error
    failed: list[tuple[str, str]]  # (test id, the exception where it is not an assertion, else "")
    seconds: float
    tail: str


# pytest's short summary (-rfE): "FAILED <id> - <message>", the message "assert ..." or "<Exception>: ..."
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", re.MULTILINE)
ASSERTION = re.compile(r"^(assert\b|AssertionError\b|Failed: )")  # an assert, or pytest.raises / pytest.fail


def failures(output: str) -> list[tuple[str, str]]:
    """The failing test ids of a pytest run, each with the exception that failed it where it is not an assertion."""
    out = []
    for test, message in FAILED.findall(output):
        kind = "" if ASSERTION.match(message) else message.split(":", 1)[0].split()[0] if message else "?"
        out.append((test, kind))
    return out


def run(mutant: Mutant | None, tests: tuple[str, ...]) -> Outcome:
    repo = fresh_copy()
    if mutant is not None:
        apply(repo, mutant)
    env = environment(repo)
    check_shadowing(repo, env)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE", *tests]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code, output = None, f"timed out after {TIMEOUT} s\n{partial}"
    seconds = time.monotonic() - start
    failed = failures(output)
    if code is None:
        verdict = "timeout"  # -x: no test had failed yet
    elif code == 0:
        verdict = "survived"
    elif code in (1, 2) and failed:  # 2: an import / collection error the mutant caused
        verdict = "caught"
    else:
        verdict = "error"
    return Outcome(mutant, verdict, failed, seconds, output[-3000:])


def short(test: str) -> str:
    return test.removeprefix("tests/")


def verdict_cell(o: Outcome) -> str:
    if o.mutant.equivalent:
        return "survived (equivalent)" if o.verdict == "survived" else f"**{o.verdict.upper()}** (labelled equivalent)"
    return o.verdict if o.verdict == "caught" else f"**{o.verdict.upper()}**"


def table(outcomes: list[Outcome]) -> str:
    lines = ["| mutant | file | what it changes | caught by | verdict | s |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.mutant
        what = f"{m.what}. *Equivalent:* {m.reason}" if m.equivalent else m.what
        caught = "<br>".join(f"`{short(t)}`" + (f" ({kind})" if kind else "") for t, kind in o.failed[:3]) or "-"
        lines.append(f"| `{m.name}` | {m.file} | {what} | {caught} | {verdict_cell(o)} | {o.seconds:.0f} |")
    return "\n".join(lines)


def summary(outcomes: list[Outcome], seconds: float) -> tuple[str, bool]:
    """The summary line, and whether the run is clean: every counted mutant caught, no equivalent one caught."""
    counted = [o for o in outcomes if not o.mutant.equivalent]
    equivalent = [o for o in outcomes if o.mutant.equivalent]
    caught = [o for o in counted if o.verdict == "caught"]
    line = (f"{len(caught)}/{len(counted)} non-equivalent mutants caught; {len(equivalent)} equivalent "
            f"({sum(o.verdict == 'survived' for o in equivalent)} survived); total {seconds / 60:.1f} min")
    if caught:
        slowest = max(caught, key=lambda o: o.seconds)
        line += f"; slowest catch: `{slowest.mutant.name}` ({slowest.seconds:.0f} s)"
    gaps = [f"{o.mutant.name} ({o.verdict})" for o in counted if o.verdict != "caught"]
    wrong = [f"{o.mutant.name} ({o.verdict})" for o in equivalent if o.verdict != "survived"]
    if gaps:
        line += f"; not caught: {', '.join(gaps)}"
    if wrong:
        line += f"; labelled equivalent but not surviving: {', '.join(wrong)}"
    return line, not gaps and not wrong


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def header(argv: list[str]) -> str:
    """The record's title and where it was made: command, commit (and whether specnb/ or tests/ differed from it),
    date, CPU model and core count."""
    python = Path(sys.executable)
    python_name = str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else python.name
    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "specnb", "tests"):
        commit += " + uncommitted changes"
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    return (f"# Mutation run\n\n`{shlex.join([python_name, 'tests/mutants.py', *argv])}` applies each "
            f"one-line mutant to a copy of the tree and runs the tests meant to catch it there (see the docstring of "
            f"`tests/mutants.py`). This run: {time.strftime('%Y-%m-%d %H:%M')}, commit {commit}, "
            f"{models[0] if models else 'an unknown CPU'}, {os.cpu_count()} cores.")


def check_registry() -> None:
    """Names unique; a reason given exactly where a mutant is marked equivalent."""
    names = [m.name for m in MUTANTS]
    if len(set(names)) != len(names):
        raise SystemExit("two mutants share a name")
    for m in MUTANTS:
        if m.equivalent != bool(m.reason):
            raise SystemExit(f"mutant {m.name}: an equivalent mutant needs a reason, and only it has one")


def collects(selections: list[str]) -> None:
    """Exit unless pytest collects every selection (a test id renamed since it was written, a file gone)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *selections], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"some selections do not collect:\n{(done.stdout + done.stderr)[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this mutant (repeatable)")
    parser.add_argument("--baseline", action="store_true", help="run every selection on the unmutated copy")
    parser.add_argument("--list", action="store_true",
                        help="list the mutants, check their snippets and that their selections collect")
    parser.add_argument("--out", type=Path, help="also write the record (header, table, summary) to this file")
    args = parser.parse_args()

    check_registry()
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    selections = sorted({t for m in chosen for t in m.tests})

    if args.list:
        for m in chosen:
            text = (ROOT / "specnb" / m.file).read_text()
            assert text.count(m.old) == 1, f"{m.name}: snippet found {text.count(m.old)} times"
            print(f"{m.name:40} {m.file:28} {' '.join(m.tests)}{'  [equivalent]' if m.equivalent else ''}")
        collects(selections)
        print(f"{len(chosen)} mutants; every snippet occurs once, all {len(selections)} selections collect")
        return 0

    if args.baseline:
        start, bad = time.monotonic(), []
        for test in selections:
            o = run(None, (test,))
            print(f"{o.verdict:9} {o.seconds:6.0f} s  {test}", flush=True)
            if o.verdict != "survived":
                bad.append(test)
                print(o.tail)
        print(f"baseline: {len(selections) - len(bad)}/{len(selections)} selections pass unmutated, "
              f"{time.monotonic() - start:.0f} s")
        return 1 if bad else 0

    start, outcomes = time.monotonic(), []
    for m in chosen:
        o = run(m, m.tests)
        outcomes.append(o)
        caught = ", ".join(short(t) + (f" ({kind})" if kind else "") for t, kind in o.failed[:2])
        print(f"{o.verdict:9} {o.seconds:5.0f} s  {m.name}  {caught}", flush=True)
        if o.verdict in ("error", "timeout"):
            print(o.tail)
    line, clean = summary(outcomes, time.monotonic() - start)
    report = table(outcomes)
    print(f"\n{report}\n\n{line}")
    if args.out:
        args.out.write_text(f"{header(sys.argv[1:])}\n\n{report}\n\n{line}\n")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
