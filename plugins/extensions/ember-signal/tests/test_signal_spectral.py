"""ember.stft / ember.istft against torch, windows against torch.signal.windows and torch.*_window, and the mel
filter banks and Spectrogram / MelSpectrogram modules against torchaudio's formulas written in torch below
(torchaudio is not a dependency): values on flex, flex+autodiff, fused flex and OpenCL, gradients, bad input, toy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import DeviceError, DTypeError, PluginError, ShapeError, ValueRangeError

DEVICES = ["flex", "flex+autodiff", "flex+fusion(eager_below=0)", "opencl"]
GRAD_DEVICES = ["flex+autodiff", "flex+fusion(eager_below=0)+autodiff", "opencl+autodiff"]


def device(name: str) -> Device:
    """The device ``name``, or a skip naming why it is not available here."""
    try:
        dev = Device.parse(name)
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"device {name} not available here: {exc}")
    return dev


def need_complex_autodiff() -> None:
    dev = device("flex+autodiff")
    x = ember.ones(2, device=dev, requires_grad=True)
    if not ember.complex(x, x).requires_grad:
        pytest.skip("ember-autodiff does not record complex outputs of extension ops yet (backend.run_extension "
                    "gates on is_floating_point)")


def close(got: ember.Tensor, want: torch.Tensor, tol: float = 1e-4) -> None:
    g = got.numpy()
    w = want.detach().resolve_conj().numpy()
    assert g.shape == w.shape, (g.shape, w.shape)
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
    np.testing.assert_allclose(g, w, atol=tol * scale, rtol=tol)


SIG = np.random.default_rng(0).standard_normal((2, 600)).astype(np.float32)

# stft keyword sets (window built by name and win_length): the same call on ember and torch
STFT_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("defaults-rect", {"n_fft": 64}, None),
    ("hann", {"n_fft": 64}, "hann"),
    ("hop10-win50", {"n_fft": 64, "hop_length": 10, "win_length": 50}, "hann"),
    ("odd-nfft", {"n_fft": 63, "hop_length": 7}, "hamming"),
    ("no-center-normalized", {"n_fft": 32, "hop_length": 8, "center": False, "normalized": True}, None),
    ("constant-pad", {"n_fft": 40, "pad_mode": "constant"}, "blackman"),
    ("twosided", {"n_fft": 32, "onesided": False}, "hann"),
]


def _windows(name: str | None, length: int) -> tuple[Any, Any]:
    if name is None:
        return None, None
    return getattr(ember, f"{name}_window")(length), getattr(torch, f"{name}_window")(length)


@pytest.mark.parametrize("dev_name", DEVICES)
@pytest.mark.parametrize("case", STFT_CASES, ids=[c[0] for c in STFT_CASES])
def test_stft_and_istft_match_torch(dev_name: str, case: tuple[str, dict[str, Any], str | None]) -> None:
    dev = device(dev_name)
    _, kw, wname = case
    we, wt = _windows(wname, kw.get("win_length", kw["n_fft"]))
    if we is not None:
        we = we.to(dev)
    for arr in (SIG, SIG[0]):
        got = ember.stft(ember.tensor(arr, device=dev), window=we, return_complex=True, **kw)
        want = torch.stft(torch.from_numpy(arr), window=torch.ones(kw.get("win_length", kw["n_fft"]))
                          if wt is None else wt, return_complex=True, **kw)
        close(got, want)
        as_real = ember.stft(ember.tensor(arr, device=dev), window=we, return_complex=False, **kw)
        close(as_real, torch.view_as_real(want))
        ikw = {k: v for k, v in kw.items() if k != "pad_mode"}
        if wt is None:  # torch warns about the rectangular window; ember uses it silently, as asked
            wt = torch.ones(kw["n_fft"])
        close(ember.istft(got, window=we, **ikw), torch.istft(want, window=wt, **ikw))
        close(ember.istft(got, window=we, length=arr.shape[-1] + 5, **ikw),
              torch.istft(want, window=wt, length=arr.shape[-1] + 5, **ikw))


def test_stft_of_complex_input_is_two_sided() -> None:
    z = (SIG[0] + 1j * SIG[1]).astype(np.complex64)
    got = ember.stft(ember.tensor(z), 32, window=ember.hann_window(32))
    want = torch.stft(torch.from_numpy(z), 32, window=torch.hann_window(32), return_complex=True)
    close(got, want)
    back = ember.istft(got, 32, window=ember.hann_window(32), return_complex=True)
    close(back, torch.istft(want, 32, window=torch.hann_window(32), return_complex=True))


def test_stft_bad_input_raises_typed_errors() -> None:
    x = ember.tensor(SIG[0])
    with pytest.raises(ValueRangeError, match="return_complex"):
        ember.stft(x, 32)
    with pytest.raises(ShapeError, match="1D or 2D"):
        ember.stft(ember.zeros(1, 2, 3), 4, return_complex=True)
    with pytest.raises(ShapeError, match="win_length=32"):
        ember.stft(x, 32, window=ember.hann_window(16), return_complex=True)
    with pytest.raises(ValueRangeError, match="win_length <= n_fft"):
        ember.stft(x, 32, win_length=40, return_complex=True)
    with pytest.raises(ValueRangeError, match="n_fft <="):
        ember.stft(ember.zeros(10), 64, center=False, return_complex=True)
    with pytest.raises(ValueRangeError, match="pad_mode"):
        ember.stft(x, 32, pad_mode="wrap", return_complex=True)
    spec = ember.stft(x, 32, return_complex=True)
    with pytest.raises(DTypeError, match="complex-valued input"):
        ember.istft(ember.view_as_real(spec), 32)
    with pytest.raises(ShapeError, match="n_fft // 2 \\+ 1"):
        ember.istft(spec, 48, onesided=True)
    with pytest.raises(ValueRangeError, match="overlap add min"):
        ember.istft(spec, 32, window=ember.zeros(32))


@pytest.mark.parametrize("dev_name", GRAD_DEVICES)
def test_stft_istft_gradients_match_torch(dev_name: str) -> None:
    need_complex_autodiff()
    dev = device(dev_name)
    wt = torch.hann_window(64)
    x = ember.tensor(SIG, device=dev, requires_grad=True)
    spec = ember.stft(x, 64, hop_length=16, window=ember.hann_window(64, device=dev), return_complex=True)
    back = ember.istft(spec * 2, 64, hop_length=16, window=ember.hann_window(64, device=dev), length=600)
    ((spec.abs() ** 2).mean() + (back * back).sum() * 1e-3).backward()
    xt = torch.from_numpy(SIG).requires_grad_()
    st = torch.stft(xt, 64, hop_length=16, window=wt, return_complex=True)
    bt = torch.istft(st * 2, 64, hop_length=16, window=wt, length=600)
    ((st.abs() ** 2).mean() + (bt * bt).sum() * 1e-3).backward()
    close(x.grad, xt.grad, 2e-4)


@pytest.mark.parametrize("pad_mode", ["reflect", "constant", "replicate"])
@pytest.mark.parametrize("kernel", ["flex-kernel", "composition"])
@pytest.mark.parametrize("complex_input", [False, True], ids=["real", "complex"])
def test_stft_window_and_input_gradients_match_torch(kernel: str, complex_input: bool, pad_mode: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The framing op (signal.frames: unfold times the window in one pass) and the overlap-add op (its adjoint, used
    by istft) differentiate in the input and the window, through flex's kernels and through the default
    compositions alike; reflect and constant centre padding happen inside the framing op (its vjp folds the padding
    back), other modes through F.pad first."""
    need_complex_autodiff()
    import ember_signal._ops as ops
    from ember.extension import _clear_resolution

    if kernel == "composition":
        monkeypatch.delitem(ops.frames.kernels, "flex")
        monkeypatch.delitem(ops.overlap_add.kernels, "flex")
        _clear_resolution()
    try:
        rng = np.random.default_rng(3)
        arr = rng.standard_normal((2, 300))
        if complex_input:
            arr = arr + 1j * rng.standard_normal((2, 300))
        win = rng.random(48) + 0.5
        dev = device("flex+autodiff")
        x = ember.tensor(arr, device=dev, requires_grad=True)
        w = ember.tensor(win, device=dev, requires_grad=True)
        spec = ember.stft(x, 64, hop_length=20, win_length=48, window=w, return_complex=True, pad_mode=pad_mode)
        back = ember.istft(spec, 64, hop_length=20, win_length=48, window=w, length=300,
                           return_complex=complex_input)
        ((spec.abs() ** 2).mean() + (back.abs() ** 2).sum() * 1e-2).backward()
        xt = torch.from_numpy(arr).requires_grad_()
        wt = torch.from_numpy(win).requires_grad_()
        st = torch.stft(xt, 64, hop_length=20, win_length=48, window=wt, return_complex=True, pad_mode=pad_mode)
        bt = torch.istft(st, 64, hop_length=20, win_length=48, window=wt, length=300, return_complex=complex_input)
        ((st.abs() ** 2).mean() + (bt.abs() ** 2).sum() * 1e-2).backward()
        close(back.detach(), bt, 1e-9)
        close(spec.detach(), st, 1e-9)
        close(x.grad, xt.grad, 1e-9)
        close(w.grad, wt.grad, 1e-9)
    finally:
        monkeypatch.undo()
        _clear_resolution()


# -- windows -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hann", "hamming", "blackman", "bartlett", "kaiser"])
def test_windows_match_torch(name: str) -> None:
    for m in (0, 1, 2, 7, 16):
        for sym in (True, False):
            close(getattr(ember.signal.windows, name)(m, sym=sym),
                  getattr(torch.signal.windows, name)(m, sym=sym), 1e-6)
            close(getattr(ember, f"{name}_window")(m, periodic=not sym),
                  getattr(torch, f"{name}_window")(m, periodic=not sym), 1e-6)
    w = getattr(ember, f"{name}_window")(8, dtype=ember.float64)
    assert w.dtype is ember.float64
    close(w, getattr(torch, f"{name}_window")(8, dtype=torch.float64), 1e-12)


@pytest.mark.parametrize("name,kw", [("cosine", {}), ("gaussian", {"std": 2.5}), ("exponential", {"tau": 3.0}),
                                     ("general_cosine", {"a": [0.46, 0.23, 0.31]}),
                                     ("general_hamming", {"alpha": 0.6}), ("nuttall", {})],
                         ids=["cosine", "gaussian", "exponential", "general_cosine", "general_hamming", "nuttall"])
def test_more_signal_windows_match_torch(name: str, kw: dict[str, Any]) -> None:
    for m in (0, 1, 2, 7, 16):
        for sym in (True, False):
            close(getattr(ember.signal.windows, name)(m, sym=sym, **kw),
                  getattr(torch.signal.windows, name)(m, sym=sym, **kw), 1e-6)
    if name == "exponential":
        close(ember.signal.windows.exponential(9, center=2.0, sym=False),
              torch.signal.windows.exponential(9, center=2.0, sym=False), 1e-6)
        with pytest.raises(ValueRangeError, match="Center must be None"):
            ember.signal.windows.exponential(9, center=2.0)


def test_window_options_match_torch() -> None:
    close(ember.hamming_window(9, True, 0.5, 0.5), torch.hamming_window(9, True, 0.5, 0.5), 1e-6)
    close(ember.kaiser_window(9, False, 5.0), torch.kaiser_window(9, False, 5.0), 1e-6)
    close(ember.signal.windows.kaiser(9, beta=3.0, sym=False), torch.signal.windows.kaiser(9, beta=3.0, sym=False),
          1e-6)
    with pytest.raises(ValueRangeError, match="non-negative"):
        ember.hann_window(-1)
    with pytest.raises(DTypeError, match="floating point"):
        ember.hann_window(4, dtype=ember.int32)


# -- torchaudio's formulas, in torch (the oracle for the mel filter banks and the spectrogram modules) -----------
def _ta_hz_to_mel(f: float, scale: str) -> float:
    if scale == "htk":
        return 2595.0 * math.log10(1.0 + f / 700.0)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    mels = f / f_sp
    if f >= min_log_hz:
        mels = min_log_hz / f_sp + math.log(f / min_log_hz) / (math.log(6.4) / 27.0)
    return mels


def _ta_mel_to_hz(mels: torch.Tensor, scale: str) -> torch.Tensor:
    if scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    freqs = f_sp * mels
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * torch.exp(logstep * (mels[log_t] - min_log_mel))
    return freqs


def ta_melscale_fbanks(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                       norm: str | None = None, mel_scale: str = "htk") -> torch.Tensor:
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(_ta_hz_to_mel(f_min, mel_scale), _ta_hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = _ta_mel_to_hz(m_pts, mel_scale)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.max(torch.zeros(1), torch.min(down, up))
    if norm == "slaney":
        fb *= (2.0 / (f_pts[2:n_mels + 2] - f_pts[:n_mels])).unsqueeze(0)
    return fb


def ta_spectrogram(w: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor, power: float | None,
                   normalized: bool) -> torch.Tensor:
    shape = w.size()
    spec = torch.stft(w.reshape(-1, shape[-1]), n_fft, hop, n_fft, window, True, "reflect", False, True,
                      return_complex=True)
    spec = spec.reshape(shape[:-1] + spec.shape[-2:])
    if normalized:
        spec = spec / window.pow(2.0).sum().sqrt()
    if power is None:
        return spec
    return spec.abs() if power == 1.0 else spec.abs().pow(power)


@pytest.mark.parametrize("kw", [
    {"n_freqs": 201, "f_min": 0.0, "f_max": 8000.0, "n_mels": 40, "sample_rate": 16000},
    {"n_freqs": 257, "f_min": 20.0, "f_max": 11025.0, "n_mels": 64, "sample_rate": 22050, "norm": "slaney",
     "mel_scale": "slaney"},
    {"n_freqs": 129, "f_min": 50.0, "f_max": 4000.0, "n_mels": 20, "sample_rate": 8000, "mel_scale": "slaney"},
], ids=["htk", "slaney-norm", "slaney"])
def test_melscale_fbanks_match_torchaudio(kw: dict[str, Any]) -> None:
    close(ember.signal.melscale_fbanks(**kw), ta_melscale_fbanks(**kw), 1e-5)


def test_melscale_fbanks_bad_input() -> None:
    with pytest.raises(ValueRangeError, match="mel_scale"):
        ember.signal.melscale_fbanks(10, 0.0, 100.0, 4, 200, mel_scale="bark")
    with pytest.raises(ValueRangeError, match="norm"):
        ember.signal.melscale_fbanks(10, 0.0, 100.0, 4, 200, norm="l2")
    with pytest.warns(UserWarning, match="all zero values"):
        ember.signal.melscale_fbanks(8, 0.0, 4000.0, 40, 8000)


@pytest.mark.parametrize("dev_name", DEVICES)
def test_spectrogram_modules_match_torchaudio(dev_name: str) -> None:
    dev = device(dev_name)
    wave = np.random.default_rng(5).standard_normal((2, 1, 3000)).astype(np.float32)
    spec = ember.signal.Spectrogram(n_fft=128).to(dev)
    win = torch.hann_window(128)
    close(spec(ember.tensor(wave, device=dev)), ta_spectrogram(torch.from_numpy(wave), 128, 64, win, 2.0, False))
    mag = ember.signal.Spectrogram(n_fft=128, hop_length=32, power=1.0, normalized=True).to(dev)
    close(mag(ember.tensor(wave, device=dev)), ta_spectrogram(torch.from_numpy(wave), 128, 32, win, 1.0, True))
    mel = ember.signal.MelSpectrogram(sample_rate=8000, n_fft=128, n_mels=24).to(dev)
    fb = ta_melscale_fbanks(65, 0.0, 4000.0, 24, 8000)
    want = (ta_spectrogram(torch.from_numpy(wave), 128, 64, win, 2.0, False).transpose(-1, -2) @ fb).transpose(-1, -2)
    close(mel(ember.tensor(wave, device=dev)), want)
    assert set(dict(mel.named_buffers())) == {"spectrogram.window", "mel_scale.fb"}


def test_mel_spectrogram_defaults_are_torchaudios() -> None:
    with pytest.warns(UserWarning, match="all zero values"):  # torchaudio warns the same for its defaults
        mel = ember.signal.MelSpectrogram()
    assert (mel.sample_rate, mel.n_fft, mel.win_length, mel.hop_length, mel.n_mels, mel.power) == (
        16000, 400, 400, 200, 128, 2.0)
    assert mel.mel_scale.fb.shape == (201, 128)
    close(mel.spectrogram.window, torch.hann_window(400), 1e-6)


@pytest.mark.parametrize("dev_name", GRAD_DEVICES)
def test_mel_spectrogram_gradient_matches_torch(dev_name: str) -> None:
    need_complex_autodiff()
    dev = device(dev_name)
    wave = np.random.default_rng(6).standard_normal((2, 2000)).astype(np.float32)
    mel = ember.signal.MelSpectrogram(sample_rate=8000, n_fft=128, n_mels=16).to(dev)
    x = ember.tensor(wave, device=dev, requires_grad=True)
    (mel(x) + 1e-6).log().mean().backward()
    xt = torch.from_numpy(wave).requires_grad_()
    fb = ta_melscale_fbanks(65, 0.0, 4000.0, 16, 8000)
    st = (ta_spectrogram(xt, 128, 64, torch.hann_window(128), 2.0, False).transpose(-1, -2) @ fb).transpose(-1, -2)
    (st + 1e-6).log().mean().backward()
    close(x.grad, xt.grad, 1e-3)


def test_toy_spectrogram_raises_typed_error() -> None:
    toy = device("toy")
    with pytest.raises(DTypeError, match=r"complex64.*'toy'"):
        ember.stft(ember.tensor(SIG[0], device=toy), 32, return_complex=True)
    close(ember.hann_window(8, device=toy), torch.hann_window(8), 1e-6)  # windows need no complex numbers
