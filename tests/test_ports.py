"""Compatibility suite of issue 16: each PyTorch program under ``examples/ports/torch/`` and its ember port under
``examples/ports/`` run in lockstep -- the same initial weights (torch's, copied into ember through
``state_dict`` -> numpy -> ``load_state_dict``), the same batches -- and must agree in losses and parameters after a
few training steps, to float32 precision.

Random parts are taken out of the lockstep, and each case says how: dropout runs with p = 0 (or the model in
eval mode), noise the program draws (VAE's ``randn_like``, DCGAN's latent vectors) is drawn once in numpy and fed to
both. Every case runs on the fused default training device and on the unfused one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device

torch = pytest.importorskip("torch")

PORTS = Path(__file__).resolve().parents[1] / "examples" / "ports"
#: float32 lockstep tolerances (relative to each tensor's largest magnitude)
LOSS_RTOL = 1e-4
PARAM_TOL = 2e-4



def _backend() -> Device:
    """The default device's backend, undecorated (EMBER_DEVICE may carry decorators, e.g. flex+autodiff)."""
    default = Device.default()
    return Device(default.kind, default.index)


DEVICES = {
    "fused": lambda: _backend().autodiff(),
    "unfused": lambda: _backend().fusion(False).autodiff(),
}


def load(name: str, framework: str) -> ModuleType:
    """``examples/ports/<name>.py`` (ember) or ``examples/ports/torch/<name>.py``, imported by path under a
    private module name (the torch originals live in a folder named ``torch``: never put it on sys.path)."""
    path = PORTS / (f"torch/{name}.py" if framework == "torch" else f"{name}.py")
    mod_name = f"_ember_port_{framework}_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


def copy_weights(src: Any, dst: Any, device: Device) -> None:
    """torch module -> ember module: every state_dict entry through numpy, strict (same names, in the same order:
    a port's checkpoints line up with the original's)."""
    assert list(dst.state_dict()) == list(src.state_dict()), "state_dict keys (or their order) differ from torch's"
    state = {k: ember.tensor(v.detach().cpu().numpy().copy(), device=device) for k, v in src.state_dict().items()}
    dst.load_state_dict(state)


def assert_params_close(tm: Any, em: Any, what: str, noise_only: dict[str, slice] | None = None) -> None:
    """Every named parameter of the torch module against the ember one of the same name. ``noise_only`` names
    parameter slices whose exact gradient is zero, so Adam-type updates there follow round-off noise (its sign
    differs between any two implementations): they are left out of the comparison."""
    t_params = dict(tm.named_parameters())
    e_params = dict(em.named_parameters())
    assert list(t_params) == list(e_params), f"{what}: parameter names differ"
    for name, tp in t_params.items():
        ref = tp.detach().numpy().astype(np.float64)
        got = e_params[name].detach().numpy().astype(np.float64)
        if noise_only and name in noise_only:
            ref[noise_only[name]] = got[noise_only[name]] = 0.0
        scale = max(float(np.max(np.abs(ref))), 1e-6)
        err = float(np.max(np.abs(got - ref))) / scale
        assert err <= PARAM_TOL, f"{what}: parameter {name} differs from torch by {err:.2e} (relative)"


def assert_buffers_close(tm: Any, em: Any, what: str) -> None:
    """Every named buffer (BatchNorm running statistics and counters) of the torch module against ember's."""
    t_bufs = dict(tm.named_buffers())
    e_bufs = dict(em.named_buffers())
    assert sorted(t_bufs) == sorted(e_bufs), f"{what}: buffer names differ"
    for name, tb in t_bufs.items():
        np.testing.assert_allclose(e_bufs[name].numpy(), tb.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{what}: buffer {name}")


def assert_losses_close(t_losses: list[float], e_losses: list[float], what: str) -> None:
    np.testing.assert_allclose(e_losses, t_losses, rtol=LOSS_RTOL, atol=1e-6, err_msg=f"{what}: losses")


# ----------------------------------------------------------------------------------------------------------
# word_lm: tied-weight 2-layer LSTM LM, manual SGD on p.data, clip_grad_norm_, repackaged hidden state
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_word_lm_lockstep(flavour: str) -> None:
    """dropout = 0 for the lockstep (the program's own default is 0.2); 3 BPTT steps carry the hidden state."""
    tw, ew = load("word_lm", "torch"), load("word_lm", "ember")
    dev = DEVICES[flavour]()
    lines = tw.corpus_text(60)
    t_corpus, e_corpus = tw.Corpus(lines), ew.Corpus(lines)
    assert t_corpus.dictionary.idx2word == e_corpus.dictionary.idx2word
    np.testing.assert_array_equal(e_corpus.train.numpy(), t_corpus.train.numpy())
    ntokens, bsz, bptt, lr = len(t_corpus.dictionary), 4, 6, 20.0

    torch.manual_seed(0)
    tm = tw.build(ntokens, torch.device("cpu"), emsize=16, nhid=16, dropout=0.0)
    em = ew.build(ntokens, dev, emsize=16, nhid=16, dropout=0.0)
    assert em.decoder.weight is em.encoder.weight  # tied
    copy_weights(tm, em, dev)
    assert em.decoder.weight is em.encoder.weight  # still tied after loading
    tm.train()
    em.train()
    t_data = tw.batchify(t_corpus.train, bsz, torch.device("cpu"))
    e_data = ew.batchify(e_corpus.train, bsz, dev)
    t_hidden, e_hidden = tm.init_hidden(bsz), em.init_hidden(bsz)
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(0, 3 * bptt, bptt):
        t_x, t_y = tw.get_batch(t_data, i, bptt)
        e_x, e_y = ew.get_batch(e_data, i, bptt)
        loss, t_hidden = tw.train_step(tm, t_x, t_y, t_hidden, lr)
        t_losses.append(loss)
        loss, e_hidden = ew.train_step(em, e_x, e_y, e_hidden, lr)
        e_losses.append(loss)
    assert_losses_close(t_losses, e_losses, "word_lm")
    assert_params_close(tm, em, "word_lm")
    for t_h, e_h in zip(t_hidden, e_hidden):
        np.testing.assert_allclose(e_h.detach().numpy(), t_h.detach().numpy(), rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------------------------------------------------
# mnist_cnn: conv-conv-maxpool-fc, log_softmax + nll_loss, Adadelta + StepLR
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_mnist_cnn_lockstep(flavour: str) -> None:
    """Dropout off through eval mode (the model has no other train/eval difference); a StepLR step between the two
    training steps, so the second runs at lr 0.7."""
    tp, ep = load("mnist_cnn", "torch"), load("mnist_cnn", "ember")
    dev = DEVICES[flavour]()
    x, y = tp.digits_28x28()
    ex, ey = ep.digits_28x28()
    np.testing.assert_array_equal(ex, x)
    torch.manual_seed(0)
    tm, t_opt, t_sched = tp.build(torch.device("cpu"))
    em, e_opt, e_sched = ep.build(dev)
    copy_weights(tm, em, dev)
    tm.eval()
    em.eval()
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(2):
        xb, yb = x[8 * i:8 * i + 8], y[8 * i:8 * i + 8]
        t_losses.append(tp.train_step(tm, t_opt, torch.from_numpy(xb), torch.from_numpy(yb)))
        e_losses.append(ep.train_step(em, e_opt, ember.tensor(xb, device=dev), ember.tensor(yb, device=dev)))
        t_sched.step()
        e_sched.step()
    assert e_opt.param_groups[0]["lr"] == pytest.approx(t_opt.param_groups[0]["lr"])
    assert_losses_close(t_losses, e_losses, "mnist_cnn")
    assert_params_close(tm, em, "mnist_cnn")


# ----------------------------------------------------------------------------------------------------------
# vae: fc VAE, BCE(sum) + KLD, Adam
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_vae_lockstep(flavour: str) -> None:
    """The reparameterisation noise (``randn_like`` in the program) is drawn once per step in numpy and fed to both
    models through an instance-level ``reparameterize`` with the program's formula ``mu + eps * exp(0.5 logvar)``."""
    tv, ev = load("vae", "torch"), load("vae", "ember")
    dev = DEVICES[flavour]()
    x = tv.digits_28x28()
    np.testing.assert_array_equal(ev.digits_28x28(), x)
    torch.manual_seed(0)
    tm, t_opt = tv.build(torch.device("cpu"))
    em, e_opt = ev.build(dev)
    copy_weights(tm, em, dev)
    rng = np.random.default_rng(0)
    eps = [np.zeros((16, 20), np.float32)]
    tm.reparameterize = lambda mu, logvar: mu + torch.from_numpy(eps[0]) * torch.exp(0.5 * logvar)
    em.reparameterize = lambda mu, logvar: mu + ember.tensor(eps[0], device=dev) * ember.exp(0.5 * logvar)
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(3):
        eps[0] = rng.standard_normal((16, 20), dtype=np.float32)
        xb = x[16 * i:16 * i + 16]
        t_losses.append(tv.train_step(tm, t_opt, torch.from_numpy(xb)))
        e_losses.append(ev.train_step(em, e_opt, ember.tensor(xb, device=dev)))
    assert_losses_close(t_losses, e_losses, "vae")
    assert_params_close(tm, em, "vae")
    # the program's own reparameterize: randn_like noise of the right shape, on the model's device
    mu, logvar = ember.zeros(4, 20, device=dev), ember.zeros(4, 20, device=dev)
    z = ev.VAE.reparameterize(em, mu, logvar)
    assert z.shape == (4, 20) and z.device == dev and float(z.std().item()) > 0.5


# ----------------------------------------------------------------------------------------------------------
# dcgan: ConvTranspose2d generator, Conv2d/BatchNorm/LeakyReLU discriminator, BCELoss, two Adams, weights_init
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_dcgan_lockstep(flavour: str) -> None:
    """The latent noise (``randn`` in the program's loop) is drawn in numpy and passed to both ``train_step``s;
    BatchNorm trains in train mode, so running statistics are compared too."""
    tg, eg = load("dcgan", "torch"), load("dcgan", "ember")
    dev = DEVICES[flavour]()
    x = tg.digits_32x32()
    np.testing.assert_array_equal(eg.digits_32x32(), x)
    torch.manual_seed(0)
    t_parts = tg.build(torch.device("cpu"), nz=16, ngf=8, ndf=8)
    e_parts = eg.build(dev, nz=16, ngf=8, ndf=8)
    for t_net, e_net in zip(t_parts[:2], e_parts[:2]):
        copy_weights(t_net, e_net, dev)
    rng = np.random.default_rng(0)
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(2):
        xb = x[8 * i:8 * i + 8]
        noise = rng.standard_normal((8, 16, 1, 1), dtype=np.float32)
        t_losses += tg.train_step(*t_parts, torch.from_numpy(xb), torch.from_numpy(noise))
        e_losses += eg.train_step(*e_parts, ember.tensor(xb, device=dev), ember.tensor(noise, device=dev))
    assert_losses_close(t_losses, e_losses, "dcgan")
    for what, t_net, e_net in (("dcgan netG", t_parts[0], e_parts[0]), ("dcgan netD", t_parts[1], e_parts[1])):
        assert_params_close(t_net, e_net, what)
        assert_buffers_close(t_net, e_net, what)


def test_dcgan_weights_init_draws_the_documented_distributions() -> None:
    """The program's ``weights_init`` (``m.weight.data.normal_``, ``m.bias.data.fill_``) on ember modules."""
    eg = load("dcgan", "ember")
    ember.manual_seed(0)
    net_g = eg.build(Device.default().autodiff(), nz=16, ngf=32, ndf=32)[0]
    conv_w = net_g.main[3].weight.detach().numpy()  # ConvTranspose2d(128, 64, 4, 2, 1): 131072 samples
    bn = net_g.main[1]
    assert abs(float(conv_w.mean())) < 1e-3 and abs(float(conv_w.std()) - 0.02) < 1e-3
    assert abs(float(bn.weight.detach().numpy().mean()) - 1.0) < 0.01 and not bn.bias.detach().numpy().any()


# ----------------------------------------------------------------------------------------------------------
# text_classifier: nn.TransformerEncoder with a key padding mask, masked mean pooling, label smoothing, AdamW,
# SequentialLR(LinearLR, CosineAnnealingLR), clip_grad_norm_
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_text_classifier_lockstep(flavour: str) -> None:
    """dropout = 0 for the lockstep (the program's default is 0.1); 3 steps cross the warm-up into the cosine."""
    tt, et = load("text_classifier", "torch"), load("text_classifier", "ember")
    dev = DEVICES[flavour]()
    tokens, labels, vocab = tt.make_dataset(24, max_len=16)
    e_tokens, e_labels, e_vocab = et.make_dataset(24, max_len=16)
    assert e_vocab == vocab
    np.testing.assert_array_equal(e_tokens, tokens)
    np.testing.assert_array_equal(e_labels, labels)
    kwargs = {"total_steps": 6, "warmup": 2, "d_model": 16, "nhead": 2, "dim_feedforward": 32, "dropout": 0.0,
              "max_len": 16}
    torch.manual_seed(0)
    t_parts = tt.build(len(vocab), len(tt.TOPICS), torch.device("cpu"), **kwargs)
    e_parts = et.build(len(vocab), len(et.TOPICS), dev, **kwargs)
    copy_weights(t_parts[0], e_parts[0], dev)
    t_parts[0].train()
    e_parts[0].train()
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(3):
        xb, yb = tokens[8 * i:8 * i + 8], labels[8 * i:8 * i + 8]
        t_losses.append(tt.train_step(*t_parts, torch.from_numpy(xb), torch.from_numpy(yb)))
        e_losses.append(et.train_step(*e_parts, ember.tensor(xb, device=dev), ember.tensor(yb, device=dev)))
        assert e_parts[2].param_groups[0]["lr"] == pytest.approx(t_parts[2].param_groups[0]["lr"])
    assert_losses_close(t_losses, e_losses, "text_classifier")
    # the key projection's bias shifts every score of a query alike, which softmax cancels: its gradient is zero
    # up to round-off, and AdamW turns that noise into +-lr steps whose signs no two implementations share
    d = kwargs["d_model"]
    key_bias = {f"encoder.layers.{i}.self_attn.in_proj_bias": slice(d, 2 * d) for i in range(2)}
    assert_params_close(t_parts[0], e_parts[0], "text_classifier", noise_only=key_bias)
    for name in key_bias:
        b = dict(e_parts[0].named_parameters())[name].detach().numpy()[d:2 * d]
        assert np.max(np.abs(b)) <= 3 * 1e-3 * 1.01, name  # at most lr per step from its zero start


# ----------------------------------------------------------------------------------------------------------
# resnet_block: BasicBlocks with BatchNorm and projection shortcuts, `out += shortcut(x)`, SGD Nesterov + weight
# decay, CosineAnnealingLR
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", list(DEVICES))
def test_resnet_block_lockstep(flavour: str) -> None:
    """No randomness in a step (no dropout); BatchNorm in train mode, running statistics compared."""
    tr, er = load("resnet_block", "torch"), load("resnet_block", "ember")
    dev = DEVICES[flavour]()
    images, labels = tr.make_images(16, size=16)
    e_images, e_labels = er.make_images(16, size=16)
    np.testing.assert_array_equal(e_images, images)
    np.testing.assert_array_equal(e_labels, labels)
    torch.manual_seed(0)
    t_parts = tr.build(torch.device("cpu"), width=4, num_blocks=(1, 1, 1), total_steps=4)
    e_parts = er.build(dev, width=4, num_blocks=(1, 1, 1), total_steps=4)
    copy_weights(t_parts[0], e_parts[0], dev)
    t_parts[0].train()
    e_parts[0].train()
    t_losses: list[float] = []
    e_losses: list[float] = []
    for i in range(2):
        xb, yb = images[8 * i:8 * i + 8], labels[8 * i:8 * i + 8]
        t_losses.append(tr.train_step(*t_parts, torch.from_numpy(xb), torch.from_numpy(yb)))
        e_losses.append(er.train_step(*e_parts, ember.tensor(xb, device=dev), ember.tensor(yb, device=dev)))
    assert e_parts[2].param_groups[0]["lr"] == pytest.approx(t_parts[2].param_groups[0]["lr"])
    assert_losses_close(t_losses, e_losses, "resnet_block")
    assert_params_close(t_parts[0], e_parts[0], "resnet_block")
    assert_buffers_close(t_parts[0], e_parts[0], "resnet_block")


# ----------------------------------------------------------------------------------------------------------
# every ember port runs as a program
# ----------------------------------------------------------------------------------------------------------
PROGRAMS = sorted(p.stem for p in PORTS.glob("*.py"))


def test_every_port_has_its_torch_original_and_a_lockstep_test() -> None:
    assert PROGRAMS == sorted(p.stem for p in (PORTS / "torch").glob("*.py"))
    assert not (PORTS / "torch" / "__init__.py").exists()  # never importable as `torch`
    for name in PROGRAMS:
        assert f"test_{name}_lockstep" in globals(), name


@pytest.mark.parametrize("name", PROGRAMS)
def test_port_main_runs_quick(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``main(["--quick"])`` of the ember port: its own data pipeline, device creation, seeding and loop."""
    assert load(name, "ember").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "loss" in out.lower() and "nan" not in out.lower(), out
