"""A few training steps on a tiny random target: loss goes down, checkpoints round-trip and resume."""

import json

import pytest
import torch

from dflash_trt.decoding.model.drafters import load_drafter
from dflash_trt.testing import make_tiny_target
from dflash_trt.training.features import target_features
from dflash_trt.training.trainer import TrainConfig, Trainer, use_bf16

LAYER_IDS = (1, 3)


def _samples(model, count=3, length=24, prompt_len=6):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, model.config.vocab_size, (length,), generator=g).tolist() for _ in range(count)]
    feats = target_features(model, ids, LAYER_IDS)
    return [{"idx": i, "ids": torch.tensor(x, dtype=torch.int32), "prompt_len": prompt_len,
             "features": f.to(torch.bfloat16)} for i, (x, f) in enumerate(zip(ids, feats))]


def _trainer(tmp_path, model, samples, **overrides):
    settings = dict(out=str(tmp_path / "run"), num_layers=1, block_size=4, target_layer_ids=LAYER_IDS,
                    mask_token_id=model.config.vocab_size - 1, intermediate_size=64, lr=3e-3, warmup_steps=1,
                    batch_size=3, blocks_per_seq=8, max_steps=40, save_every=1000)
    cfg = TrainConfig(**{**settings, **overrides})
    return Trainer(cfg, samples, model.get_input_embeddings().weight, model.get_output_embeddings().weight,
                   model.config)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loss_goes_down_on_a_tiny_target(tmp_path, precision):
    model = make_tiny_target("llama")
    trainer = _trainer(tmp_path, model, _samples(model), precision=precision)
    assert trainer.bf16 == (precision == "bf16")
    losses = [trainer.train_step()["loss"] for _ in range(40)]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    # Autocast computes in bf16; the weights the optimiser updates (and the checkpoint) stay fp32.
    assert {p.dtype for p in trainer.drafter.parameters()} == {torch.float32}


def test_a_bf16_step_is_close_to_the_fp32_step(tmp_path):
    model = make_tiny_target("llama")
    samples = _samples(model)
    first = {p: _trainer(tmp_path / p, model, samples, precision=p).train_step()["loss"] for p in ("fp32", "bf16")}
    assert first["bf16"] == pytest.approx(first["fp32"], rel=0.02)
    assert first["bf16"] != first["fp32"]  # the bf16 step really computed in bf16


def test_unknown_precision_is_refused():
    assert use_bf16("fp32") is False and use_bf16("bf16") is True
    with pytest.raises(ValueError, match="precision must be"):
        use_bf16("fp16")


def test_checkpoint_round_trips_in_published_format(tmp_path):
    model = make_tiny_target("llama")
    trainer = _trainer(tmp_path, model, _samples(model), max_steps=3)
    trainer.run()
    loaded = load_drafter(tmp_path / "run" / "drafter")
    for name, tensor in trainer.published_drafter().state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    config = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    assert config["dflash_config"] == {"target_layer_ids": list(LAYER_IDS), "mask_token_id": 255}
    assert config["block_size"] == 4 and "embed_tokens.weight" not in loaded.state_dict()


def test_training_resumes_from_its_last_state(tmp_path):
    model = make_tiny_target("llama")
    samples = _samples(model)
    first = _trainer(tmp_path, model, samples, max_steps=2)
    first.run()
    resumed = _trainer(tmp_path, model, samples, max_steps=4)
    assert resumed.step == 2
    torch.testing.assert_close(resumed.drafter.state_dict(), first.drafter.state_dict())
    resumed.run()
    assert resumed.step == 4


def test_published_drafter_on_raw_features_equals_training_on_scaled_features(tmp_path):
    from dflash_trt.training.recipe import build_batch, drafter_block_states

    model = make_tiny_target("llama")
    samples = _samples(model)
    trainer = _trainer(tmp_path, model, samples, max_steps=2)
    trainer.run()
    anchors = [torch.tensor([8, 12])] * len(samples)
    batch = build_batch(samples, anchors, 4, model.config.vocab_size - 1, 4.0)
    scaled = dict(batch, features=batch["features"] / trainer.scale)
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        want = drafter_block_states(trainer.drafter, embed, scaled)
        got = drafter_block_states(load_drafter(tmp_path / "run" / "drafter"), embed, batch)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_warm_start_continues_from_a_published_drafter(tmp_path):
    import pytest

    from dflash_trt.errors import ConfigError

    model = make_tiny_target("llama")
    samples = _samples(model)
    first = _trainer(tmp_path / "a", model, samples, max_steps=3)
    first.run()
    published = tmp_path / "a" / "run" / "drafter"
    warm = _trainer(tmp_path / "b", model, samples, init_from=str(published))
    assert warm.step == 0  # fresh optimiser and schedule
    # Feature scaling is undone and redone around the published fc: the same drafter comes back out.
    for name, tensor in load_drafter(published).state_dict().items():
        torch.testing.assert_close(warm.published_drafter().state_dict()[name], tensor, rtol=1e-5, atol=1e-6)
    assert warm.train_step()["loss"] < _trainer(tmp_path / "c", model, samples).train_step()["loss"]
    with pytest.raises(ConfigError, match="block_size 4 != 8"):
        _trainer(tmp_path / "d", model, samples, init_from=str(published), block_size=8)


def test_samples_that_appear_while_training_are_picked_up_next(tmp_path):
    model = make_tiny_target("llama")
    samples = _samples(model, count=5)
    polls = []

    def refresh(known):
        polls.append(set(known))
        return [s for s in samples[3:] if s["idx"] not in known]  # two answers arrive after the start

    trainer = _trainer(tmp_path, model, samples[:3], max_steps=1, batch_size=1, refresh_every=1)
    trainer.refresh = refresh
    trainer.run()
    assert polls == [{0, 1, 2}] and sorted(trainer.by_idx) == [0, 1, 2, 3, 4]
    # The new samples are the next ones trained on: the order is popped from its end.
    assert trainer.order[-2:] == [3, 4] and len(trainer.order) == 4
    trainer.cfg.max_steps = 2
    trainer.run()
    assert polls[1] == {0, 1, 2, 3, 4} and trainer.order[-1] == 3  # sample 4 was trained on, then nothing new


def test_dflash2_training_starts_as_dflash_and_learns(tmp_path):
    from dflash_trt.decoding.model.drafters import DFlash2Drafter, DFlashDrafter
    from dflash_trt.training.recipe import build_batch, drafter_block_states

    model = make_tiny_target("llama")
    samples = _samples(model)
    trainer = _trainer(tmp_path, model, samples, arch="dflash2", conv_group_size=16, selector_rank=8,
                       selector_top_k=4, max_steps=3)
    drafter = trainer.drafter
    assert isinstance(drafter, DFlash2Drafter)
    # Identity convolutions and a zero successor codebook: the same states and scores as DFlash.
    plain = DFlashDrafter(trainer.drafter.config)
    plain.load_state_dict({k: v for k, v in drafter.state_dict().items() if k in plain.state_dict()})
    batch = build_batch(samples, [torch.tensor([6, 10])] * 3, 4, 255, gamma=4.0)
    with torch.no_grad():
        torch.testing.assert_close(drafter_block_states(drafter, model.get_input_embeddings().weight, batch),
                                   drafter_block_states(plain, model.get_input_embeddings().weight, batch))
    assert drafter.candidate_selector.successor_codebook.abs().max() == 0
    losses = [trainer.train_step()["loss"] for _ in range(30)]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert drafter.candidate_selector.successor_codebook.abs().max() > 0  # the selector learns too
    trainer.run()
    loaded = load_drafter(tmp_path / "run" / "drafter")
    config = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    assert isinstance(loaded, DFlash2Drafter) and config["architectures"] == ["DFlash2DraftModel"]
    assert config["dflash_config"]["selector_top_k"] == 4 and config["dflash_config"]["block_size"] == 4


def test_family_repeats_weight_an_epoch_and_unknown_families_are_refused(tmp_path):
    from collections import Counter

    from dflash_trt.commands.train_drafter import parse_family_repeats
    from dflash_trt.errors import ConfigError, DFlashError

    model = make_tiny_target("llama")
    samples = _samples(model, count=4)
    for s in samples:
        s["family"] = "source" if s["idx"] == 3 else "template"
    trainer = _trainer(tmp_path, model, samples, batch_size=1, family_repeats={"source": 3})
    epoch = Counter(trainer._next_samples()[0]["idx"] for _ in range(6))  # 3 template + 3 x the source
    assert epoch == {0: 1, 1: 1, 2: 1, 3: 3}
    with pytest.raises(ConfigError, match="without samples: sourse"):
        _trainer(tmp_path / "typo", model, samples, family_repeats={"sourse": 3})
    assert parse_family_repeats("a=4, b=2") == {"a": 4, "b": 2} and parse_family_repeats("") == {}
    for bad in ("a", "a=0", "=2", "a=x"):
        with pytest.raises(DFlashError, match="FAMILY=N"):
            parse_family_repeats(bad)


def test_a_dflash2_run_warm_starts_from_a_v1_drafter_exactly_where_it_is(tmp_path):
    from dflash_trt.decoding.model.drafters import DFlash2Drafter
    from dflash_trt.errors import ConfigError
    from dflash_trt.training.recipe import build_batch, drafter_block_states

    model = make_tiny_target("llama")
    samples = _samples(model)
    dflash2 = dict(arch="dflash2", conv_group_size=16, selector_rank=8, selector_top_k=4)
    v1_run = _trainer(tmp_path / "v1", model, samples, max_steps=3)
    v1_run.run()
    published = tmp_path / "v1" / "run" / "drafter"
    warm = _trainer(tmp_path / "v2", model, samples, init_from=str(published), **dflash2)
    assert isinstance(warm.drafter, DFlash2Drafter)
    batch = build_batch(samples, [torch.tensor([6, 10])] * 3, 4, 255, gamma=4.0)
    embed = model.get_input_embeddings().weight
    with torch.no_grad():  # the v1 weights, with identity convolutions: the v1 drafter's states
        torch.testing.assert_close(drafter_block_states(warm.published_drafter(), embed, batch),
                                   drafter_block_states(load_drafter(published), embed, batch))
    v2_published = tmp_path / "v2" / "run" / "drafter"
    warm.save()
    with pytest.raises(ConfigError, match="cannot warm-start a dflash run from a dflash2 drafter"):
        _trainer(tmp_path / "back", model, samples, init_from=str(v2_published))


@pytest.mark.parametrize("arch", ["dflash", "dflash2"])
def test_a_warm_start_may_add_layers_and_starts_exactly_where_the_source_is(tmp_path, arch):
    from dflash_trt.errors import ConfigError
    from dflash_trt.training.recipe import build_batch, drafter_block_states

    model = make_tiny_target("llama")
    samples = _samples(model)
    family = dict(arch="dflash2", conv_group_size=16, selector_rank=8, selector_top_k=4) if arch == "dflash2" else {}
    source_run = _trainer(tmp_path / "src", model, samples, num_layers=2, max_steps=5, **family)
    source_run.run()
    published = tmp_path / "src" / "run" / "drafter"
    grown = _trainer(tmp_path / "grown", model, samples, num_layers=5, init_from=str(published), **family)
    assert len(grown.drafter.layers) == 5
    # Layers 0, 0', 0'', 1, 1' (source layer j * 2 // 5): copies add nothing until their outputs are trained.
    layers = grown.drafter.layers
    torch.testing.assert_close(layers[3].self_attn.q_proj.weight, source_run.drafter.layers[1].self_attn.q_proj.weight)
    torch.testing.assert_close(layers[4].mlp.up_proj.weight, source_run.drafter.layers[1].mlp.up_proj.weight)
    for copy in (1, 2, 4):
        assert layers[copy].self_attn.o_proj.weight.abs().max() == 0 and layers[copy].mlp.down_proj.weight.abs().max() == 0
    assert layers[3].self_attn.o_proj.weight.abs().max() > 0
    batch = build_batch(samples, [torch.tensor([6, 10])] * 3, 4, 255, gamma=4.0)
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        want = drafter_block_states(load_drafter(published), embed, batch)
        got = drafter_block_states(grown.published_drafter(), embed, batch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    losses = [grown.train_step()["loss"] for _ in range(20)]  # and the copies learn
    assert layers[1].self_attn.o_proj.weight.abs().max() > 0 and losses[-1] < losses[0]
    with pytest.raises(ConfigError, match="num_hidden_layers 2 > 1 of this run"):
        _trainer(tmp_path / "shrunk", model, samples, num_layers=1, init_from=str(published), **family)
