"""L-BFGS (``torch.optim.LBFGS``): limited-memory BFGS over the flattened parameters, optionally with a
strong-Wolfe line search. A port of PyTorch's algorithm (itself after minFunc), step for step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..autograd import enable_grad, no_grad
from ..errors import DTypeError, ValueRangeError
from ..ops.creation import zeros
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range, _is_int, _is_number

_Obj = Callable[[list[Tensor], float, Tensor], tuple[float, Tensor]]


def _dot(a: Tensor, b: Tensor) -> float:
    return float(a.dot(b).item())


def _cubic_interpolate(x1: float, f1: float, g1: float, x2: float, f2: float, g2: float,
                       bounds: tuple[float, float] | None = None) -> float:
    """Minimizer of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to ``bounds``."""
    xmin_bound, xmax_bound = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(obj_func: _Obj, x: list[Tensor], t: float, d: Tensor, f: float, g: Tensor, gtd: float,
                  c1: float = 1e-4, c2: float = 0.9, tolerance_change: float = 1e-9, max_ls: int = 25
                  ) -> tuple[float, Tensor, float, int]:
    """Line search along ``d`` for a step satisfying the strong Wolfe conditions (bracketing, then zoom)."""
    d_norm = d.abs().max().item()
    g = g.clone()
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = _dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    ls_iter = 0
    bracket: list[float] = []
    bracket_f: list[float] = []
    bracket_g: list[Tensor] = []
    bracket_gtd: list[float] = []
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        # extrapolate
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.clone(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:  # reached the maximum number of iterations
        bracket, bracket_f, bracket_g = [0.0, t], [f, f_new], [g, g_new]
    # zoom: refine the bracket until the point satisfies the conditions
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            # too close to a boundary: move away unless progress was sufficient last time
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new.clone(), gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new.clone(), gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS(Optimizer):
    """L-BFGS: each ``step(closure)`` runs up to ``max_iter`` quasi-Newton iterations (``closure`` re-evaluates the
    model and returns the loss after calling ``backward``). ``line_search_fn="strong_wolfe"`` enables the line
    search; without it each iteration takes the step ``lr``. One parameter group only, as in PyTorch; the state
    (the curvature history) lives under the first parameter."""

    def __init__(self, params: Any, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        if max_eval is None and _is_int(max_iter):
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueRangeError("LBFGS: doesn't support per-parameter options (parameter groups)")
        self._params: list[Tensor] = self.param_groups[0]["params"]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.param_groups:
            raise ValueRangeError("LBFGS: doesn't support per-parameter options (parameter groups)")
        super().add_param_group(param_group)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("LBFGS", "learning rate (lr)", group["lr"])
        for key in ("max_iter", "max_eval", "history_size"):
            if not _is_int(group[key]) or group[key] < (0 if key == "max_eval" else 1):
                raise ValueRangeError(f"LBFGS: invalid {key} {group[key]!r}: expected a positive integer")
        _check_range("LBFGS", "tolerance_grad", group["tolerance_grad"])
        _check_range("LBFGS", "tolerance_change", group["tolerance_change"])
        if group["line_search_fn"] not in (None, "strong_wolfe"):
            raise ValueRangeError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got "
                                  f"{group['line_search_fn']!r}")

    def _check_group_values(self, name: str, i: int, group: dict[str, Any]) -> None:
        # line_search_fn defaults to None but may be a string; _validate_group checks its value
        super()._check_group_values(name, i, dict(group, line_search_fn=None))

    # -- flat views of the parameters ------------------------------------------------------------------------
    def _numel(self) -> int:
        return sum(p.numel() for p in self._params)

    def _gather_flat_grad(self) -> Tensor:
        from ..ops.shape import cat

        views = [zeros(p.numel(), dtype=p._dtype, device=p._device) if p.grad is None
                 else p.grad.to(p._dtype).reshape(-1) for p in self._params]
        return cat(views, 0)

    def _add_grad(self, step_size: float, update: Tensor) -> None:
        offset = 0
        for p in self._params:
            n = p.numel()
            p.add_(update[offset:offset + n].reshape(tuple(p.shape)) * step_size)
            offset += n

    def _clone_param(self) -> list[Tensor]:
        return [p.clone() for p in self._params]

    def _set_param(self, params_data: list[Tensor]) -> None:
        for p, data in zip(self._params, params_data):
            p.copy_(data)

    def _evaluate(self, closure: Callable[[], Any]) -> tuple[Any, float]:
        with enable_grad():
            loss = closure()
        return loss, float(loss.item() if isinstance(loss, Tensor) else loss)

    def _directional_evaluate(self, closure: Callable[[], Any], x: list[Tensor], t: float,
                              d: Tensor) -> tuple[float, Tensor]:
        self._add_grad(t, d)
        _, loss = self._evaluate(closure)
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Run up to ``max_iter`` iterations; ``closure`` (required) zeroes the grads, computes the loss, calls
        ``backward`` and returns the loss. Returns the loss of the first evaluation."""
        if closure is None or not callable(closure):
            raise DTypeError("LBFGS.step: requires a closure that re-evaluates the model and returns the loss")
        with no_grad():
            return self._step(closure)

    def _step(self, closure: Callable[[], Any]) -> Any:
        group = self.param_groups[0]
        lr, max_iter, max_eval = float(group["lr"]), group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss, loss = self._evaluate(closure)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        opt_cond = flat_grad.abs().max().item() <= tolerance_grad
        if opt_cond:  # optimal condition
            return orig_loss
        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        h_diag = state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            # compute the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro, h_diag = [], [], [], 1.0
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = _dot(y, s)
                if ys > 1e-10:  # update the memory
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / _dot(y, y)
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                # two-loop recursion: q = -H g
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = _dot(old_stps[i], q) * ro[i]
                    q.add_(old_dirs[i] * -al[i])
                d = r = q * h_diag
                for i in range(num_old):
                    be_i = _dot(old_dirs[i], r) * ro[i]
                    r.add_(old_stps[i] * (al[i] - be_i))
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            # the step length: the first iteration is scaled by the gradient's size
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / flat_grad.abs().sum().item()) * lr
            else:
                t = lr
            gtd = _dot(flat_grad, d)
            if gtd > -tolerance_change:  # directional derivative below tolerance
                break
            ls_func_evals = 0
            if line_search_fn is not None:
                x_init = self._clone_param()

                def obj_func(x: list[Tensor], t: float, d: Tensor) -> tuple[float, Tensor]:
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                                  max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = flat_grad.abs().max().item() <= tolerance_grad
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    # re-evaluate unless this is the last iteration (no use then)
                    _, loss = self._evaluate(closure)
                    flat_grad = self._gather_flat_grad()
                    opt_cond = flat_grad.abs().max().item() <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            # stopping conditions
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if (d * t).abs().max().item() <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break
        state["d"], state["t"] = d, t
        state["old_dirs"], state["old_stps"], state["ro"], state["H_diag"] = old_dirs, old_stps, ro, h_diag
        state["prev_flat_grad"], state["prev_loss"] = prev_flat_grad, prev_loss
        return orig_loss

    # -- checkpoints: the state is flat vectors and lists of them, checked here ------------------------------
    def _prepare_load(self, state_dict: Any, cast: bool) -> tuple[Any, list[dict[str, Any]]]:
        name = "LBFGS.load_state_dict"
        saved = state_dict.get("state") if isinstance(state_dict, dict) else None
        stripped = dict(state_dict, state={}) if isinstance(saved, dict) else state_dict
        new_state, groups = super()._prepare_load(stripped, cast)
        first = state_dict["param_groups"][0]["params"][0] if state_dict["param_groups"][0]["params"] else None
        entry = saved.get(first, saved.get(str(first))) if first is not None else None
        if entry:
            new_state[self._params[0]] = self._check_lbfgs_state(name, entry, groups[0], cast)
        return new_state, groups

    def _check_lbfgs_state(self, name: str, entry: Any, group: dict[str, Any], cast: bool) -> dict[str, Any]:
        p0, n = self._params[0], self._numel()
        known = {"func_evals", "n_iter", "d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad",
                 "prev_loss", "al"}
        if not isinstance(entry, dict) or not set(entry) <= known:
            raise ValueRangeError(f"{name}: the state must be a dict with keys from {sorted(known)}, got "
                                  f"{sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__}")

        def vec(key: str, v: Any) -> Tensor:
            if not isinstance(v, Tensor) or tuple(v.shape) != (n,) or not v._dtype.is_floating_point:
                raise ValueRangeError(f"{name}: state[{key!r}] must be a floating vector of the {n} parameter "
                                      f"values, got {v!r:.80}")
            return v.to(p0._device, p0._dtype).clone() if cast else v

        def num(key: str, v: Any) -> float:
            v = v.item() if isinstance(v, Tensor) and v.numel() == 1 else v
            if not _is_number(v) or not math.isfinite(v):
                raise ValueRangeError(f"{name}: state[{key!r}] is {v!r:.80}; expected a finite number")
            return v

        out: dict[str, Any] = {}
        for key in ("func_evals", "n_iter"):
            v = entry.get(key, 0)
            if not _is_int(v) or v < 0:
                raise ValueRangeError(f"{name}: state[{key!r}] is {v!r}; expected an int >= 0")
            out[key] = v
        for key in ("d", "prev_flat_grad"):
            if entry.get(key) is not None:
                out[key] = vec(key, entry[key])
        for key in ("t", "H_diag", "prev_loss"):
            if entry.get(key) is not None:
                out[key] = num(key, entry[key])
        lists = [entry.get(k) for k in ("old_dirs", "old_stps", "ro")]
        if any(v is not None for v in lists):
            if not all(isinstance(v, list) for v in lists) or len({len(v) for v in lists}) != 1:
                raise ValueRangeError(f"{name}: state['old_dirs'], ['old_stps'] and ['ro'] must be lists of one "
                                      "length")
            out["old_dirs"] = [vec("old_dirs", v) for v in lists[0]]
            out["old_stps"] = [vec("old_stps", v) for v in lists[1]]
            out["ro"] = [num("ro", v) for v in lists[2]]
            if len(out["ro"]) > group["history_size"]:
                raise ValueRangeError(f"{name}: the history holds {len(out['ro'])} pairs, more than history_size "
                                      f"{group['history_size']}")
        if "al" in entry:
            al = entry["al"]
            if not isinstance(al, list) or len(al) < len(out.get("ro", [])):
                raise ValueRangeError(f"{name}: state['al'] must be a list covering the history, got {al!r:.80}")
            out["al"] = [None if v is None else num("al", v) for v in al]
        if out.get("n_iter", 0) > 0 and any(k not in out for k in ("d", "t", "old_dirs", "prev_flat_grad")):
            raise ValueRangeError(f"{name}: a state with n_iter > 0 lacks d/t/old_dirs/prev_flat_grad")
        return out
