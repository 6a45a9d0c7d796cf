"""min_tokens, bad words and penalties: Hugging Face's tokens in plain and DFlash decoding alike.

Greedy oracle: transformers' generate with min_new_tokens, bad_words_ids and repetition_penalty. Presence and
frequency penalties (no HF processor) against a step-by-step reference of the formula. DFlash must give
plain decoding's tokens: the oracle drafter proposes the constrained continuation, so drafts are accepted
across the positions where a processor acts, which only works when slot j is processed with the committed
tokens + drafts 1..j.
"""

import pytest
import torch
from core_oracle import OracleDrafter

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.logits_processors import process
from dflash_trt.decoding.step.sampling import SamplingParams, choose_keyed
from dflash_trt.errors import DFlashError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_drafter_config

MAX_NEW_TOKENS = 24
NUM_PROMPTS = 6


@pytest.fixture(scope="module")
def setup():
    model = make_tiny_target("llama", seed=1)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 250, (int(n),), generator=generator).tolist()
               for n in torch.randint(3, 16, (NUM_PROMPTS,), generator=generator)]
    plain = [_hf(model, p) for p in prompts]
    return model, TargetModel(model), prompts, plain


def _hf(model, prompt, eos=None, **settings):
    """HF greedy continuation, cut after the first eos (generate pads after it)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos if eos is not None else 0, **settings)[0, len(prompt):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


def _cases(model, prompts, plain):
    """(SamplingParams, HF's tokens) per prompt, each setting chosen to change the unconstrained output."""
    early = plain[2][2]  # as the end id, the unconstrained output stops within 3 tokens
    multi = (plain[1][4], plain[1][5])
    cases = [
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS, bad_words_ids=((plain[0][3],),)),
         _hf(model, prompts[0], bad_words_ids=[[plain[0][3]]])),
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS, bad_words_ids=(multi, (255, 254, 253))),
         _hf(model, prompts[1], bad_words_ids=[list(multi), [255, 254, 253]])),
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=(early,), min_tokens=10),
         _hf(model, prompts[2], eos=early, min_new_tokens=10)),
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS, repetition_penalty=1.8),
         _hf(model, prompts[3], repetition_penalty=1.8)),
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS, repetition_penalty=1.3, stop_token_ids=(plain[4][1],),
                        min_tokens=6, bad_words_ids=((plain[4][5],),)),
         _hf(model, prompts[4], eos=plain[4][1], min_new_tokens=6, repetition_penalty=1.3,
             bad_words_ids=[[plain[4][5]]])),
        (SamplingParams(max_new_tokens=MAX_NEW_TOKENS), plain[5]),  # no processor, in the same batch
    ]
    for index, (params, expected) in enumerate(cases[:-1]):
        assert expected != plain[index][:len(expected)], f"case {index} does not change the output"
    assert len(_hf(model, prompts[2], eos=early)) <= 3  # without min_tokens it ends within 3 tokens
    return cases


def _oracle(model, prompts, expected, block_size):
    oracle = OracleDrafter(tiny_drafter_config(model.config, block_size=block_size),
                           [p + e for p, e in zip(prompts, expected)])
    oracle.load_state_dict(make_tiny_drafter(model.config, block_size=block_size).state_dict())
    return oracle


@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_greedy_equals_hugging_face_with_the_processors(setup, block_size):
    model, target, prompts, plain = setup
    cases = _cases(model, prompts, plain)
    params, expected = [c[0] for c in cases], [c[1] for c in cases]
    drafter = _oracle(model, prompts, expected, block_size) if block_size > 1 else None
    results = generate(target, drafter, prompts, params, block_size)
    for index, (result, tokens) in enumerate(zip(results, expected)):
        assert result.token_ids == tokens, f"block {block_size}, case {index}"
    if block_size > 1:  # drafts were accepted, so slots past the committed tokens were processed
        assert max(max(r.acceptance_lengths) for r in results) >= 4
    assert results[2].finish_reason == "stop" and len(results[2].token_ids) >= 10


def _reference_penalized(model, prompt, presence, frequency, temperature=0.0, seed=0):
    """Step by step: counts over prompt + output, logit/T - presence*[c>0] - frequency*c, then the choice."""
    tokens = list(prompt)
    for index in range(MAX_NEW_TOKENS):
        with torch.inference_mode():
            logits = model(torch.tensor([tokens])).logits[0, -1].float()
        counts = torch.bincount(torch.tensor(tokens), minlength=logits.shape[0]).float()
        scaled = logits / temperature if temperature > 0 else logits
        scaled = scaled - presence * (counts > 0).float() - frequency * counts
        if temperature > 0:  # TensorRT-LLM's order: temperature first, then the penalties
            token = int(choose_keyed(scaled[None], SamplingParams(temperature=1.0), seed, index)[0])
        else:
            token = int(torch.argmax(scaled))
        tokens.append(token)
    return tokens[len(prompt):]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_presence_and_frequency_penalties_follow_the_formula(setup, temperature):
    model, target, prompts, plain = setup
    settings = [(1.5, 0.0), (0.0, 0.7), (0.5, 0.4), (-0.5, 0.3)]
    params = [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=temperature, seed=index,
                             presence_penalty=presence, frequency_penalty=frequency)
              for index, (presence, frequency) in enumerate(settings)]
    expected = [_reference_penalized(model, prompts[i], *settings[i], temperature, seed=i) for i in range(4)]
    unpenalized = [_reference_penalized(model, prompts[i], 0.0, 0.0, temperature, seed=i) for i in range(4)]
    assert all(e != u for e, u in zip(expected, unpenalized))
    for block_size in (1, 4, 8):
        drafter = _oracle(model, prompts[:4], expected, block_size) if block_size > 1 else None
        results = generate(target, drafter, prompts[:4], params, block_size)
        assert [r.token_ids for r in results] == expected, f"block {block_size}"


def test_sampled_dflash_equals_plain_decoding_with_the_processors(setup):
    model, target, prompts, plain = setup
    params = [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=seed, top_k=20,
                             repetition_penalty=1.4, frequency_penalty=0.3, min_tokens=12,
                             stop_token_ids=(plain[seed][1], plain[seed][2]), bad_words_ids=((plain[seed][0],),))
              for seed in range(NUM_PROMPTS)]
    alone = generate(target, None, prompts, params, 1)
    unprocessed = generate(target, None, prompts, [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0,
                                                                  seed=s, top_k=20) for s in range(NUM_PROMPTS)], 1)
    assert [r.token_ids for r in alone] != [r.token_ids for r in unprocessed]
    for result, p in zip(alone, params):
        assert p.bad_words_ids[0][0] not in result.token_ids
        assert not set(result.token_ids[:12]) & set(p.stop_token_ids)
    for block_size in (4, 8):
        drafter = _oracle(model, prompts, [r.token_ids for r in alone], block_size)
        results = generate(target, drafter, prompts, params, block_size)
        assert [r.token_ids for r in results] == [r.token_ids for r in alone], f"block {block_size}"
        assert sum(r.num_accepted_tokens for r in results) > NUM_PROMPTS * 4


def test_dflash2_rejection_sampling_sees_the_processed_logits():
    # Drafts drawn from the selector's q go through rejection sampling against the target's probabilities:
    # those must be the processed ones, or the banned token and the early end token come back.
    model = make_tiny_target("llama", vocab_size=6, logit_scale=3.0, seed=3)
    drafter = make_tiny_drafter(model.config, block_size=4, mask_token_id=0, family="dflash2", selector_top_k=3,
                                seed=4)
    target, prompt, count = TargetModel(model), [1, 4, 2, 5], 60

    def run(**processors):
        params = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=s, stop_token_ids=(2,), **processors)
                  for s in range(count)]
        return generate(target, drafter, [prompt] * count, params, 4)

    free = run()
    assert any(3 in r.token_ids for r in free) and any(len(r.token_ids) < 5 for r in free)
    assert sum(r.num_accepted_tokens for r in free) > count
    for result in run(bad_words_ids=((3,),), min_tokens=5):
        assert 3 not in result.token_ids and len(result.token_ids) >= 5


def test_slot_j_is_processed_with_the_drafts_before_it():
    logits = torch.zeros(4, 10)
    params = SamplingParams(min_tokens=3, stop_token_ids=(9,), bad_words_ids=((1, 2), (5,)), frequency_penalty=1.0)
    out = process(logits, params, history=[7, 1], num_generated=1, drafts=[2, 1, 4])
    assert torch.isinf(out[:, 5]).all()  # a one-token word: every slot
    assert out[:2, 9].isinf().all() and not out[2:, 9].isinf().any()  # 1 then 2 generated: masked; 3: free
    assert out[0, 2].isinf() and not out[1, 2].isinf() and out[2, 2].isinf()  # after ...1, after ...1 2, after ...2 1
    assert out[3, 1] == -2 and out[2, 4] == 0 and out[3, 4] == -1 and out[3, 2] == -1  # counts include drafts 1..j


@pytest.mark.parametrize("settings, message", [
    (dict(min_tokens=-1), "min_tokens must be >= 0, got -1"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0, got 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number > 0, got inf"),
    (dict(presence_penalty=float("nan")), "presence_penalty must be a finite number, got nan"),
    (dict(frequency_penalty=float("-inf")), "frequency_penalty must be a finite number, got -inf"),
    (dict(bad_words_ids=((),)), "bad_words_ids must be non-empty sequences of token ids >= 0"),
    (dict(bad_words_ids=((3, -1),)), "bad_words_ids must be non-empty sequences of token ids >= 0"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(DFlashError) as failure:
        SamplingParams(**settings)
    assert message in str(failure.value) and "\n" not in str(failure.value)


def test_neutral_settings_need_no_processing():
    assert not SamplingParams(min_tokens=5).has_logits_processors  # no stop token to hold back
    assert not SamplingParams(stop_token_ids=(2,), min_tokens=0).has_logits_processors
    assert SamplingParams(stop_token_ids=(2,), min_tokens=1).has_logits_processors
    assert SamplingParams(presence_penalty=0.1).has_logits_processors
