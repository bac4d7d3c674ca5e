"""Config loading: presets, overrides, and one clear error per bad key or value."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ibpo_jax import config

CONFIGS = sorted(str(p) for p in Path(__file__).parents[2].glob("configs/*.py")
                 if p.stem not in ("__init__", "base"))


def test_every_config_has_all_presets_and_matches_its_algorithm():
    assert len(CONFIGS) == 8
    for path in CONFIGS:
        algo = Path(path).stem
        for preset in ("arith_tiny", "arith_long", "smoke", "qwen3_32b_math", "qwen3_0.6b_math"):
            c = config.load(f"{path}:{preset}")
            assert c.algo == algo and c.preset == preset
            assert (c.ibpo.operator == "terminal") == (not algo.startswith("ibpo_"))
            assert c.loss.name == algo.removeprefix("ibpo_").split("_")[-1]
            assert (c.prm.weight > 0) == (algo == "prm_gspo")
            assert c.score.enabled == (algo == "score_grpo")
            # Second-round rows have prompts of their own: never the grouped layout.
            assert (c.update_layout == "packed") == (algo == "score_grpo")


def test_second_rounds_exclude_each_other_and_leave_grouped_layout():
    with pytest.raises(config.ConfigError, match="config.ibpo.correction_rollouts and "
                                                 "config.score.enabled each add a second round"):
        config.load("configs/score_grpo.py:smoke", [("ibpo.correction_rollouts", "true")])
    c = config.load("configs/ibpo_gspo.py:smoke", [("ibpo.correction_rollouts", "true")])
    assert c.optim.layout == "grouped" and c.update_layout == "packed"
    c = config.load("configs/ibpo_gspo.py:smoke", [("ibpo.correction_rollouts", "true"),
                                                   ("cancellation.transform", "min_replace")])
    assert c.update_layout == "rows"


def test_score_stage_two_must_start_before_the_run_ends():
    c = config.load("configs/score_grpo.py")  # arith_tiny: 50 steps, stage I the first 15
    assert (c.train.steps, c.score.stage1_steps) == (50, 15)
    with pytest.raises(config.ConfigError, match=r"config.score.stage1_steps=50: the run ends "
                                                 r"after 50 steps \(config.train.steps=50\)"):
        config.load("configs/score_grpo.py", [("score.stage1_steps", "50")])
    # 25,600 trajectories at 2 x 32 x 8 per step: 50 steps, whatever train.steps says.
    with pytest.raises(config.ConfigError, match=r"config.train.budget=25600 \(50 steps of 512"):
        config.load("configs/score_grpo.py", [("train.steps", "200"),
                                              ("score.stage1_steps", "50"),
                                              ("train.budget", "25600")])
    config.load("configs/score_grpo.py", [("train.steps", "200"), ("score.stage1_steps", "49"),
                                          ("train.budget", "25600")])


def test_default_preset_is_arith_tiny_and_paper_preset_has_paper_hyperparameters():
    c = config.load("configs/ibpo_gspo.py")
    assert c.preset == "arith_tiny" and c.task.name == "arith" and c.warm_start.enabled
    p = config.load("configs/ibpo_gspo.py:qwen3_32b_math")
    # Paper §4.1: lr 1e-6, β 0.01, G 8, λ 0.5, 400 steps.
    assert (p.optim.lr, p.loss.beta, p.rollout.group_size, p.ibpo.lam, p.train.steps) == (
        1e-6, 0.01, 8, 0.5, 400)
    # One device or a pod: "auto" starts jax.distributed only for a multi-process launch.
    assert p.model.preset == "qwen3-32b" and p.train.distributed == "auto"


def test_overrides_are_typed():
    c = config.load("configs/grpo.py:smoke", [("optim.lr", "3e-4"), ("train.steps", "7"),
                                              ("ibpo.credit", "token"), ("train.progress", "true")])
    assert c.optim.lr == 3e-4 and c.train.steps == 7 and c.ibpo.credit == "token"
    assert c.train.progress is True


@pytest.mark.parametrize(
    "overrides, match",
    [
        ([("optim.lrr", "1")], r"config.optim.lrr.*valid keys here:.*\blr\b"),
        ([("optimizer.lr", "1")], r"no section 'optimizer'.*valid:.*optim"),
        ([("train.steps", "many")], r"config.train.steps='many': expected int"),
        ([("train.steps", "0")], r"config.train.steps=0: must be > 0"),
        ([("loss.name", "gpso")], r"unknown policy loss 'gpso' \(config key config.loss.name\)"
                                  r"; valid: .*gspo"),
        ([("ibpo.operator", "lcs2")], r"unknown comparison operator 'lcs2'.*lcs_first_error"),
        ([("ibpo.granularity", "word")], r"config.ibpo.granularity='word': valid: step, token"),
        ([("optim.microbatches", "3")], r"must divide"),
        ([("rollout.top_p", "1.5")], r"config.rollout.top_p=1.5: must be in \(0, 1\]"),
        # Non-finite floats, named by their full key.
        ([("optim.lr", "inf")], r"config.optim.lr=inf: must be finite"),
        ([("ibpo.lam", "nan")], r"config.ibpo.lam=nan: must be finite"),
        ([("loss.beta", "-inf")], r"config.loss.beta=-inf: must be finite"),
        ([("optim.lr", "-1e-4")], r"config.optim.lr=-0.0001: must be >= 0"),
        ([("optim.b1", "1.0")], r"config.optim.b1=1.0: must be in \[0, 1\)"),
        ([("optim.b2", "-0.1")], r"config.optim.b2=-0.1: must be in \[0, 1\)"),
        ([("rollout.temperature", "1e-4")], r"config.rollout.temperature=0.0001: must be 0 "
                                            r"\(greedy\) or >= 0.001"),
        ([("eval.temperature", "-1")], r"config.eval.temperature=-1.0: must be 0"),
        ([("reward.wrong", "1.0")], r"config.reward.wrong=1.0: must be < config.reward.correct"),
        ([("reward.sandbox", "loose")], r"config.reward.sandbox='loose': valid: strict, "
                                        r"best_effort"),
        ([("ibpo.alignment", "dtw")], r"config.ibpo.alignment='dtw': valid: lcs, prefix"),
        ([("ibpo.reduce", "min")], r"config.ibpo.reduce='min': valid: max, mean"),
        ([("diagnostics.grad_var_every", "-1")], r"config.diagnostics.grad_var_every=-1: "
                                                 r"must be >= 0"),
        ([("train.allow_config_change", "maybe")], r"config.train.allow_config_change='maybe'"
                                                   r": expected bool"),
        ([("advantage.gae_lambda", "1.5")], r"config.advantage.gae_lambda=1.5: must be in"),
        ([("mesh.data", "0")], r"config.mesh.data=0: must be -1 or > 0"),
        ([("mesh.tensor", "-2")], r"config.mesh.tensor=-2: must be -1 or > 0"),
        ([("mesh.fsdp", "-1")], r"config.mesh.data=-1 and config.mesh.fsdp=-1: only one mesh "
                                r"axis may be -1"),
        ([("train.distributed", "yes")], r"config.train.distributed='yes': valid: auto, true, "
                                         r"false"),
        ([("model.tiny.num_hidden_layers", "0")], r"config.model.tiny: .*num_hidden_layers"),
        ([("warm_start.warmup_steps", "900")], r"config.warm_start.warmup_steps=900: must be < "
                                               r"config.warm_start.steps=800"),
    ],
)
def test_bad_keys_and_values_name_the_key(overrides, match):
    with pytest.raises((config.ConfigError, KeyError), match=match):
        config.load("configs/ibpo_gspo.py:smoke", overrides)


def test_bad_files_and_presets(tmp_path):
    with pytest.raises(config.ConfigError, match="no config file"):
        config.load("configs/nope.py")
    with pytest.raises(config.ConfigError, match=r"unknown preset 'huge'; valid: arith_tiny"):
        config.load("configs/gspo.py:huge")
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(arg=None):\n    return {'seed': 0}\n")
    with pytest.raises(config.ConfigError):
        config.load(str(bad))


def test_round_trip_through_dict():
    c = config.load("configs/ibpo_ppo.py:smoke")
    assert config.from_dict(c.to_dict()) == c
    # A checkpoint written before a knob existed still loads, with the knob's default.
    old = c.to_dict()
    del old["diagnostics"], old["reward"]["sandbox"]
    assert config.from_dict(old) == c


def test_distributed_is_auto_true_or_false_and_old_bools_still_load():
    c = config.load("configs/ibpo_gspo.py:smoke")
    assert c.train.distributed == "auto" and c.mesh == config.MeshConfig(data=-1)
    for raw in ("true", "false", "auto"):
        assert config.load("configs/ibpo_gspo.py:smoke",
                           [("train.distributed", raw)]).train.distributed == raw
    old = c.to_dict()  # a checkpoint's config from before "auto"
    for flag, now in ((True, "true"), (False, "false")):
        old["train"]["distributed"] = flag
        assert config.from_dict(old).train.distributed == now
    assert config.load("configs/ibpo_gspo.py:smoke", [("mesh.data", "1"), ("mesh.fsdp", "-1")]
                       ).mesh == config.MeshConfig(data=1, fsdp=-1, tensor=1)


def test_defaults_live_in_the_dataclasses():
    """The ConfigDict of configs/base.py is generated from the dataclasses' defaults
    (`config.defaults()`): every key has a dataclass field and a default, and the sections
    check themselves when built directly (no ConfigDict)."""
    from configs import base

    d = base.make("ibpo_gspo", "smoke").to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(config.RunConfig)}
    # RunConfig()'s values, except the defaults a section resolves from its other fields.
    built, generated = config.RunConfig().to_dict(), config.defaults()
    assert generated["loss"]["clip_eps_low"] == generated["loss"]["clip_eps_high"] == "auto"
    for key in ("clip_eps_low", "clip_eps_high"):
        generated["loss"][key] = built["loss"][key]
    assert generated == built
    assert config.RunConfig().loss == config.LossConfig()
    assert d["reward"]["sandbox"] == "strict" and d["ibpo"]["alignment"] == "lcs"
    assert d["ibpo"]["reduce"] == "max" and d["diagnostics"]["grad_var_every"] == 0
    assert d["train"]["allow_config_change"] is False
    with pytest.raises(config.ConfigError, match=r"config.optim.b2=1.0: must be in \[0, 1\)"):
        config.OptimConfig(b2=1.0)
    with pytest.raises(config.ConfigError, match=r"config.loss.clip_eps_high=nan: must be"):
        config.LossConfig(clip_eps_high=float("nan"))
    with pytest.raises(config.ConfigError, match=r"config.rollout.top_k=1.5: expected int"):
        config.RolloutConfig(top_k=1.5)
    assert config.EvalConfig(temperature=0).temperature == 0.0  # greedy, widened to float


def test_tiny_model_reuses_qwen3_config_fields():
    from ibpo_jax import models
    from ibpo_jax.trainer import policy

    c = config.load("configs/ibpo_gspo.py:smoke")
    arch = policy.architecture(c, vocab_size=40)
    assert isinstance(arch, models.Qwen3Config)
    assert (arch.hidden_size, arch.num_hidden_layers, arch.head_dim) == (64, 2, 16)
    assert arch.rope_theta == 10_000.0 and arch.tie_word_embeddings and arch.vocab_size == 40
    assert arch.max_position_embeddings == 4 * (64 + 40)
    tiny = {f.name for f in dataclasses.fields(config.TinyModelConfig)}
    assert tiny == {f.name for f in dataclasses.fields(models.Qwen3Config)} - {
        "vocab_size", "max_position_embeddings"}


def test_modules_below_the_trainer_do_not_import_ml_collections():
    code = ("import sys; import ibpo_jax.trainer.loop, ibpo_jax.trainer.step, ibpo_jax.config; "
            "assert 'ml_collections' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_config_field_has_a_docstring():
    """One schema: each field of each section carries its documentation (an attribute
    docstring right after it), so `--config.x` is explained where it is defined."""
    import ast
    import inspect

    from ibpo_jax.config import logging_section as config_logging
    from ibpo_jax.config import sections as config_sections
    from ibpo_jax.config import task_sections as config_tasks
    from ibpo_jax.methods.prm import config as prm_config
    from ibpo_jax.methods.score import config as score_config

    missing = []
    for module in (config_sections, config_tasks, config_logging, config, prm_config,
                   score_config):
        for node in ast.parse(inspect.getsource(module)).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for field, after in zip(node.body, [*node.body[1:], None]):
                documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                is_field = isinstance(field, ast.AnnAssign) and "ClassVar" not in ast.unparse(
                    field.annotation)
                if is_field and not documented:
                    missing.append(f"{node.name}.{field.target.id}")
    assert not missing, missing


@pytest.mark.parametrize("algo,clip", [
    ("gspo", (3e-4, 4e-4)), ("ibpo_gspo", (3e-4, 4e-4)),  # GSPO's sequence-ratio range
    ("grpo", (0.2, 0.2)), ("ibpo_grpo", (0.2, 0.2)), ("ppo", (0.2, 0.2)), ("ibpo_ppo", (0.2, 0.2)),
])
def test_algorithms_use_the_papers_clip_ranges(algo, clip):
    # Pinned by hand (DESIGN §4), not read back from the module that sets them.
    cfg = config.load(f"configs/{algo}.py")
    assert (cfg.loss.clip_eps_low, cfg.loss.clip_eps_high) == clip


def test_the_clip_range_defaults_to_the_loss_named_last():
    """"auto" (the default) is the loss's own range (CLIP_EPS), resolved after the algorithm
    and the overrides: switching gspo's loss to grpo gives GRPO's range, a value given stays."""
    cfg = config.load("configs/gspo.py", [("loss.name", "grpo")])
    assert (cfg.loss.clip_eps_low, cfg.loss.clip_eps_high) == (0.2, 0.2)
    cfg = config.load("configs/grpo.py", [("loss.clip_eps_high", "0.28")])  # clip-higher
    assert (cfg.loss.clip_eps_low, cfg.loss.clip_eps_high) == (0.2, 0.28)
    cfg = config.load("configs/grpo.py", [("loss.clip_eps_low", "auto"), ("loss.name", "gspo")])
    assert (cfg.loss.clip_eps_low, cfg.loss.clip_eps_high) == (3e-4, 4e-4)
    assert config.LossConfig(name="ppo").clip_eps_low == 0.2
    with pytest.raises(config.ConfigError, match=r'config.loss.clip_eps_low=\'x\': expected '
                                                 r'float or "auto"'):
        config.load("configs/grpo.py", [("loss.clip_eps_low", "x")])
    with pytest.raises(config.ConfigError, match=r"config.loss.clip_eps_low='wide': expected a "
                                                 r'float, or "auto" for a loss of CLIP_EPS'):
        config.LossConfig(clip_eps_low="wide")


def test_derived_quantities_are_properties_of_the_config():
    cfg = config.load("configs/ibpo_gspo.py:smoke", [("eval.max_new_tokens", "0"),
                                                     ("rollout.top_k", "5")])
    assert cfg.rows_per_step == 4 * 4 == cfg.trajectories_per_step
    assert cfg.sampling() == {"max_new_tokens": 40, "temperature": 1.0, "top_p": 1.0,
                              "top_k": 5}
    assert cfg.sampling(evaluation=True) == {"max_new_tokens": 40, "temperature": 1.0,
                                             "top_p": 1.0}  # eval.max_new_tokens 0: rollout's


def test_appendix_a_diagnostics_on_by_default_and_off_in_smoke():
    assert config.load("configs/ibpo_gspo.py").diagnostics.grad_var_every == 20
    assert config.load("configs/ibpo_gspo.py:smoke").diagnostics.grad_var_every == 0
    assert config.load("configs/ibpo_gspo.py").ibpo.max_units == 0  # φ over whole responses
    cfg = config.load("configs/ibpo_gspo.py")
    assert (cfg.ibpo.alignment, cfg.ibpo.reduce) == ("lcs", "max")


def test_a_named_estimator_must_take_what_the_run_gives_it():
    """`advantage.estimator` names any ESTIMATORS entry; its kind must match the loss and the
    credit (core.advantages.TAKES), said before anything runs. auto keeps today's choice."""
    load = lambda spec, **kv: config.load(spec, list(kv.items()))
    assert load("configs/ibpo_gspo.py", **{"advantage.estimator": "grpo"}).advantage.estimator \
        == "grpo"
    load("configs/ppo.py", **{"advantage.estimator": "gae"})
    load("configs/ibpo_gspo.py", **{"advantage.estimator": "grpo_token", "ibpo.credit": "token"})
    for spec, kv, match in (
            ("configs/ibpo_gspo.py", {"advantage.estimator": "gae"}, "takes value inputs"),
            ("configs/ppo.py", {"advantage.estimator": "grpo"}, "ppo.*needs a value"),
            ("configs/ibpo_gspo.py", {"advantage.estimator": "grpo_token"}, "takes token"),
            ("configs/ibpo_gspo.py", {"advantage.estimator": "rloo"}, "unknown advantage est")):
        with pytest.raises((config.ConfigError, KeyError), match=match):
            load(spec, **kv)


def test_the_run_config_takes_the_methods_sections_from_their_registry(request):
    """RunConfig's last fields are the registered method sections (`registry.SECTIONS`), in
    name order, so the run config imports no method (tests/test_imports.py); a section whose
    KEY is not its registered name is refused."""
    import dataclasses

    from ibpo_jax.config import run
    from ibpo_jax.config.registry import SECTIONS
    from ibpo_jax.config.schema import Section, hints

    names = SECTIONS.names()
    assert names == ["prm", "score"]
    assert [f.name for f in dataclasses.fields(config.RunConfig)][-len(names):] == names
    assert all(hints(config.RunConfig)[n] is SECTIONS.get(n) for n in names)
    assert config.from_dict(config.RunConfig().to_dict()) == config.RunConfig()

    @dataclasses.dataclass(frozen=True)
    class Misnamed(Section):
        KEY = "elsewhere"

    SECTIONS.register("toy")(Misnamed)
    request.addfinalizer(lambda: SECTIONS._entries.pop("toy", None))
    with pytest.raises(TypeError, match="registered as 'toy' but its KEY is 'elsewhere'"):
        run._with_method_sections(run.CoreConfig)
