"""The preference losses on a tiny random Llama: each loss (dpo, ipo, simpo, orpo, kto, conservative dpo) against
its formula computed by hand from textbook log-softmax log-probs, its gradient against autograd of that plain
formula (through the chunked output layer), the reference switched off with LoRA equal to the base model, the live
frozen copy, the eval metrics under TRL's meanings, the mean over the pairs of the global batch whatever the
micro-batches, and DPO (and the reward model) under gradient checkpointing and bf16 against the plain fp32 step."""

from __future__ import annotations

import contextlib
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from leantrain.config import resolve
from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.methods import get_task

IGNORE = -100
VOCAB = 48


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return LlamaForCausalLM(config).eval()


def pairs(n: int, seed: int = 0, feedback: bool = False) -> dict:
    """A pairs batch as the data side gives it: 2n rows (chosen then rejected; KTO: rows then KL rows), prompts of
    different lengths masked with -100, right padding, and (KTO) desirable flags."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(2 * n):
        prompt, answer = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        ids = torch.randint(2, VOCAB, (prompt + answer,), generator=g).tolist()
        rows.append((ids, [IGNORE] * prompt + ids[prompt:]))
    t = max(len(r[0]) for r in rows)
    batch = {"input_ids": torch.tensor([r[0] + [0] * (t - len(r[0])) for r in rows]),
             "attention_mask": torch.tensor([[1] * len(r[0]) + [0] * (t - len(r[0])) for r in rows]),
             "labels": torch.tensor([r[1] + [IGNORE] * (t - len(r[1])) for r in rows])}
    if feedback:
        batch["desirable"] = torch.tensor([i % 2 for i in range(n)])
    return batch


def plain_logps(model, batch: dict) -> torch.Tensor:
    """Sum over each row's completion of log_softmax(logits)[target], the textbook way."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = F.log_softmax(logits[:, :-1], -1)
    target = batch["labels"][:, 1:]
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * (target != IGNORE)).sum(-1)


def task_for(loss: str, *extra: str):
    cfg = resolve(None, [f"preference.loss={loss}", *extra])
    return get_task("preference").configured(cfg)


def hand_loss(loss: str, pol: list, ref: list, lens: list, desirable=None, beta=0.1, gamma=0.5, eps=0.0) -> float:
    """The per-pair formulas in plain Python floats, averaged over the pairs."""
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    n = len(pol) // 2
    out = []
    for i in range(n):
        c, r, rc, rr, lc, lr = pol[i], pol[n + i], ref[i], ref[n + i], lens[i], lens[n + i]
        if loss == "dpo":
            h = (c - r) - (rc - rr)
            out.append(-math.log(sig(beta * h)) * (1 - eps) - math.log(sig(-beta * h)) * eps)
        elif loss == "ipo":
            out.append(((c / lc - r / lr) - (rc / lc - rr / lr) - 1 / (2 * beta)) ** 2)
        elif loss == "simpo":
            out.append(-math.log(sig(beta * (c / lc - r / lr) - gamma)))
        elif loss == "orpo":
            a, b = c / lc, r / lr
            odds = (a - b) - (math.log(1 - math.exp(a)) - math.log(1 - math.exp(b)))
            out.append(-a - beta * math.log(sig(odds)))
        elif loss == "kto":
            z = max(0.0, r - rr)
            out.append(1 - sig(beta * ((c - rc) - z)) if desirable[i] else 1 - sig(beta * (z - (c - rc))))
    return sum(out) / n


CASES = [("dpo", []), ("dpo", ["preference.label_smoothing=0.2"]), ("ipo", []), ("simpo", []), ("orpo", []),
         ("kto", [])]


@pytest.mark.parametrize("loss,extra", CASES)
def test_loss_equals_the_hand_computed_formula(model, loss, extra):
    feedback = loss == "kto"
    batch = pairs(3, seed=1, feedback=feedback)
    task = task_for(loss, "preference.beta=0.5", *extra)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy: the policy's weights nudged
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        ref = plain_logps(ref_model, batch)
        pol = plain_logps(model, batch)
    lens = (batch["labels"][:, 1:] != IGNORE).sum(-1).tolist()
    if task.reference != "none":
        batch["ref_logps"] = torch.stack(ref.chunk(2), -1)
    loss_sum, _ = task.step.forward_loss(model, batch)
    eps = 0.2 if extra else 0.0
    expected = hand_loss(loss, pol.tolist(), ref.tolist(), lens, batch.get("desirable", torch.zeros(3)).tolist(),
                         beta=0.5, eps=eps)
    assert loss_sum.item() / 3 == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("loss,extra", CASES)
def test_gradient_through_the_chunked_layer_equals_autograd_of_the_plain_formula(model, loss, extra):
    from leantrain.methods.preference import losses as L

    feedback = loss == "kto"
    batch = pairs(3, seed=2, feedback=feedback)
    task = task_for(loss, *extra)
    plain = copy.deepcopy(model)
    chunked = copy.deepcopy(model)
    assert install_chunked_loss(chunked, chunk_tokens=5)
    with torch.no_grad():
        ref = plain_logps(model, batch) - 0.3 * torch.arange(6.0)  # any fixed reference
    if task.reference != "none":
        batch["ref_logps"] = torch.stack(ref.chunk(2), -1)
    task.step.forward_loss(chunked, batch)[0].backward()
    pol = plain_logps(plain, batch)  # the plain formula, autograd through the full logits
    lens = (batch["labels"][:, 1:] != IGNORE).sum(-1).float()
    c, r = pol.chunk(2)
    (rc, rr), (lc, lr) = ref.chunk(2), lens.chunk(2)
    if loss == "kto":
        losses = L.kto(c, rc, r, rr, batch["desirable"], task.beta)
    else:
        losses = L.pair_loss(loss, L.PairLogps(c, r, lc, lr, rc, rr), beta=task.beta, gamma=task.gamma,
                             label_smoothing=task.label_smoothing)
    losses.sum().backward()
    for (name, a), b in zip(chunked.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_loss_is_the_mean_over_the_global_batch_whatever_the_micro_batches(model):
    """1 x 4 == 2 x 2 == 4 x 1 through the engine's step: the loss sums of the micro-batches over the global count
    of pairs, and the parameters after the step, equal the one big batch's; a padding pair (weight 0) adds nothing."""
    from accelerate import Accelerator

    from leantrain.engine.training.step import train_step

    task = task_for("dpo")
    batch = pairs(4, seed=3)
    with torch.no_grad():
        batch["ref_logps"] = torch.stack((plain_logps(model, batch) + 0.1).chunk(2), -1)
    batch["loss_weight"] = torch.ones(4)

    def micro(idx) -> dict:
        idx = np.asarray(idx)
        rows = np.concatenate([idx, idx + 4])
        out = {k: v[rows] for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
        return {**out, "ref_logps": batch["ref_logps"][idx], "loss_weight": batch["loss_weight"][idx]}

    def step(parts: list):
        m = copy.deepcopy(model).train()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        loss, _ = train_step(m, [micro(p) for p in parts], global_count=4, task=task, accelerator=Accelerator(cpu=True),
                             optimizer=opt, scheduler=sched, max_grad_norm=None)
        return loss.item() / 4, list(m.parameters())

    big_loss, big = step([[0, 1, 2, 3]])
    padded = micro([3])
    padded["loss_weight"] = torch.zeros(1)
    for parts in ([[0, 1], [2, 3]], [[0], [1], [2], [3]]):
        loss, params = step(parts)
        assert loss == pytest.approx(big_loss, rel=1e-6)
        for a, b in zip(params, big):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        assert task.step.forward_loss(model, padded)[0].item() == 0.0


def pairs_with_reference(model) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """4 pairs with precomputed reference log-probs at known offsets from the policy's; and both log-probs."""
    batch = pairs(4, seed=4)
    with torch.no_grad():
        pol = plain_logps(model, batch)
    ref = pol + torch.tensor([0.5, -0.5, 0.2, 0.1, -0.3, 0.4, 0.0, 0.0])
    batch["ref_logps"] = torch.stack(ref.chunk(2), -1)
    return batch, pol, ref


def test_eval_metrics_have_trl_meanings(model):
    task = task_for("dpo", "preference.beta=0.2")
    batch, pol, ref = pairs_with_reference(model)
    with torch.no_grad():
        values = task.evaluation.batch(*task.evaluation.outputs(model, batch))
    m = task.evaluation.metrics({k: v.numpy() for k, v in values.items()}, 0)
    chosen, rejected = 0.2 * (pol[:4] - ref[:4]), 0.2 * (pol[4:] - ref[4:])
    assert m["chosen_reward"] == pytest.approx(chosen.mean().item(), abs=1e-6)
    assert m["rejected_reward"] == pytest.approx(rejected.mean().item(), abs=1e-6)
    assert m["reward_margin"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-6)
    assert m["reward_accuracy"] == (chosen > rejected).float().mean().item()
    assert m["chosen_logps"] == pytest.approx(pol[:4].mean().item(), rel=1e-5)
    assert m["samples"] == 4


def test_step_metrics_are_trls_training_metrics_over_the_real_pairs(model):
    """DPO's step metrics (``Task.step_loss``) under TRL's names: sums over the pairs with their count, a padding
    pair (``loss_weight`` 0) in neither; the loss sum is ``forward_loss``'s."""
    task = task_for("dpo", "preference.beta=0.2")
    batch, pol, ref = pairs_with_reference(model)
    batch["loss_weight"] = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last pair pads the micro-batch
    with torch.no_grad():
        loss_sum, metrics = task.step.loss(model, batch)
        assert loss_sum.item() == pytest.approx(task.step.forward_loss(model, batch)[0].item(), rel=1e-6)
    chosen, rejected = 0.2 * (pol[:3] - ref[:3]), 0.2 * (pol[4:7] - ref[4:7])
    expected = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
                "rewards/accuracies": (chosen > rejected).float()}
    assert sorted(metrics) == sorted(expected)
    for name, values in expected.items():
        total, count = metrics[name]
        assert count.item() == 3 and total.item() == pytest.approx(values.sum().item(), abs=1e-6), name


def test_kto_step_metrics_split_the_rewards_by_label(model):
    task = task_for("kto", "preference.beta=0.5")
    batch = pairs(4, seed=5, feedback=True)  # rows 0-3 (desirable 0, 1, 0, 1), then their KL rows
    with torch.no_grad():
        pol = plain_logps(model, batch)
    batch["ref_logps"] = torch.stack([pol[:4] - 0.3, pol[4:] + 0.1], -1)
    with torch.no_grad():
        _, metrics = task.step.loss(model, batch)
    reward = 0.5 * torch.full((4,), 0.3)
    assert metrics["rewards/chosen"][1].item() == 2 and metrics["rewards/rejected"][1].item() == 2
    assert metrics["rewards/chosen"][0].item() == pytest.approx(reward[[1, 3]].sum().item(), abs=1e-5)
    assert metrics["kl"][0].item() == pytest.approx(-0.4, abs=1e-5) and metrics["kl"][1].item() == 4


def test_live_reference_is_a_frozen_copy_and_adapter_reference_is_the_base(model):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    batch = pairs(2, seed=5)
    with torch.no_grad():
        base = torch.stack(plain_logps(model, batch).chunk(2), -1)
    live = task_for("dpo", "preference.reference=live").model.bind(model)
    torch.testing.assert_close(live.reference_logps(model, batch), base, rtol=1e-5, atol=1e-5)
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))  # adapters that change outputs
    with torch.no_grad():
        assert not torch.allclose(torch.stack(plain_logps(lora, batch).chunk(2), -1), base)
    adapter = task_for("dpo", "peft.method=lora", "preference.reference=adapter")
    assert adapter.reference == "adapter"
    torch.testing.assert_close(adapter.reference_logps(lora, batch), base, rtol=1e-5, atol=1e-5)


def _loss_and_grads(model, task, batch, precision: str = "fp32", checkpointing: bool = False):
    """One training forward/backward of a copy of ``model``: the loss sum and the parameters' gradients."""
    from leantrain.modeling.switches import enable_checkpointing

    m = copy.deepcopy(model).train()
    if checkpointing:
        enable_checkpointing(m)
    with torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext():
        loss, _ = task.step.forward_loss(m, batch)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


def _live_dpo(model):
    """DPO with a live reference (the policy's weights nudged) and a policy through the chunked output layer."""
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy = copy.deepcopy(model)
    assert install_chunked_loss(policy, chunk_tokens=5)
    return task_for("dpo", "preference.reference=live").evaluation.with_reference(ref_model), policy


def test_dpo_under_gradient_checkpointing_and_bf16_equals_the_plain_fp32_computation(model):
    """DPO with a live reference, through the chunked output layer. Gradient checkpointing recomputes the same fp32
    forward: loss and gradients equal to rtol 1e-5. bf16 autocast (policy and reference both in bf16, as a run
    runs them): the loss within 1% of the fp32 one, each gradient within 5% of its norm (bf16 keeps 8 bits)."""
    batch = pairs(3, seed=7)
    task, policy = _live_dpo(model)
    loss, grads = _loss_and_grads(policy, task, batch)
    ckpt_loss, ckpt_grads = _loss_and_grads(policy, task, batch, checkpointing=True)
    torch.testing.assert_close(ckpt_loss, loss, rtol=1e-5, atol=1e-6)
    assert ckpt_grads.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)
    for ckpt in (False, True):
        low_loss, low_grads = _loss_and_grads(policy, task, batch, "bf16", checkpointing=ckpt)
        assert low_loss.item() == pytest.approx(loss.item(), rel=1e-2)
        for name, g in grads.items():
            assert (low_grads[name] - g).norm() <= 0.05 * g.norm() + 1e-6, name


def test_the_padding_of_bucketed_widths_changes_no_loss_or_gradient(model):
    """The CPU collators pad a batch to one of a few widths (leantrain.data.text.padded_width): the extra columns are
    masked, so DPO's loss and gradients (a live reference, the chunked output layer) equal the exact-width batch's."""
    from leantrain.data.text import padded_width

    batch = pairs(3, seed=11)
    width = batch["input_ids"].shape[1]
    extra = padded_width(width, 16) - width
    assert extra > 0
    wide = {"input_ids": F.pad(batch["input_ids"], (0, extra), value=0),
            "attention_mask": F.pad(batch["attention_mask"], (0, extra), value=0),
            "labels": F.pad(batch["labels"], (0, extra), value=IGNORE)}
    task, policy = _live_dpo(model)
    loss, grads = _loss_and_grads(policy, task, batch)
    wide_loss, wide_grads = _loss_and_grads(policy, task, wide)
    torch.testing.assert_close(wide_loss, loss, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(wide_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_reward_model_under_gradient_checkpointing_equals_the_plain_computation():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    task = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"]))
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **task.model.fields([])))
    batch = pairs(3, seed=8)
    batch.pop("labels")
    loss, grads = _loss_and_grads(model, task, batch)
    ckpt_loss, ckpt_grads = _loss_and_grads(model, task, batch, checkpointing=True)
    torch.testing.assert_close(ckpt_loss, loss, rtol=1e-5, atol=1e-6)
    assert ckpt_grads.keys() == grads.keys() and len(grads) > 10
    for name, g in grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_dropout_is_off_while_training_unless_kept_and_the_saved_config_keeps_it():
    from transformers import BertConfig, BertForSequenceClassification

    from leantrain.engine.devices.dropout import disable_dropout

    off = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"]))
    keep = get_task("reward-model").configured(resolve(None, ["model.task=reward-model", "preference.dropout=keep"]))
    assert not off.traits.keeps_dropout and keep.traits.keeps_dropout
    assert get_task("text-classification").traits.keeps_dropout
    assert not task_for("dpo").traits.keeps_dropout and task_for("dpo", "preference.dropout=keep").traits.keeps_dropout
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, **off.model.fields([]))).train()
    batch = pairs(3, seed=8)
    batch.pop("labels")
    assert not torch.equal(off.scores(model, batch)[0], off.scores(model, batch)[0])  # dropout draws differ
    assert disable_dropout(model) > 0 and disable_dropout(model) == 0
    trained = off.scores(model, batch)[0]
    torch.testing.assert_close(trained, off.scores(model.eval(), batch)[0], rtol=1e-6, atol=1e-7)  # = eval mode
    assert model.config.hidden_dropout_prob == 0.1 and model.config.attention_probs_dropout_prob == 0.1


def test_reference_resolves_per_loss_and_lora():
    assert task_for("dpo").reference == "precompute"
    assert task_for("dpo", "peft.method=lora").reference == "adapter"
    assert task_for("simpo").reference == "none" and task_for("simpo").beta == 2.0
    assert task_for("orpo").reference == "none"
    assert task_for("kto").data.precomputed_columns(["input_ids", "desirable"]) == ("ref_logps", "ref_kl_logps")
    assert task_for("dpo").data.precomputed_columns(["chosen_input_ids"]) == ("ref_chosen_logps", "ref_rejected_logps")
    assert task_for("dpo", "preference.reference=live").data.precomputed_columns(["chosen_input_ids"]) == ()
    from leantrain.errors import ConfigError

    with pytest.raises(ConfigError, match="preference.reference=none"):
        resolve(None, ["preference.loss=dpo", "preference.reference=none"])
    with pytest.raises(ConfigError, match="needs peft.method=lora"):
        resolve(None, ["preference.reference=adapter"])


def test_reward_model_loss_is_bradley_terry_with_centring_and_pairwise_accuracy():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = resolve(None, ["model.task=reward-model", "preference.center_rewards=0.01"])
    task = get_task("reward-model").configured(cfg)
    model = BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32,
                                                     **task.model.fields([]))).eval()
    batch = pairs(3, seed=6)
    batch.pop("labels")
    loss_sum, _ = task.step.forward_loss(model, batch)
    with torch.no_grad():
        r = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1).tolist()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = sum(-math.log(sig(r[i] - r[3 + i])) + 0.01 * (r[i] + r[3 + i]) ** 2 for i in range(3))
    assert loss_sum.item() == pytest.approx(expected, rel=1e-5)
    with torch.no_grad():
        m = task.evaluation.metrics({k: v.numpy() for k, v in task.evaluation.batch(*task.evaluation.outputs(model, batch)).items()}, 0)
    assert m["accuracy"] == pytest.approx(sum(r[i] > r[3 + i] for i in range(3)) / 3)
    assert m["loss"] == pytest.approx(expected / 3, rel=1e-5) and m["samples"] == 3


def test_loss_and_data_that_contradict_each_other_exit_2_before_the_model():
    from leantrain.methods.preference.preference import check_preference_keys
    from leantrain.errors import UserError

    with pytest.raises(UserError, match="preference.loss=kto is for unpaired feedback"):
        task_for("kto").data.check({"format": "explicit"})
    with pytest.raises(UserError, match="preference.loss=ipo compares a chosen and a rejected"):
        task_for("ipo").data.check({"format": "feedback"})
    task_for("auto").data.check({"format": "feedback"})
    with pytest.raises(UserError, match="preference.beta: for preference tuning and reward models only"):
        check_preference_keys(resolve(None, ["preference.beta=0.2"]), get_task("text-classification"))
    check_preference_keys(resolve(None, ["preference.beta=0.2"]), get_task("preference"))
