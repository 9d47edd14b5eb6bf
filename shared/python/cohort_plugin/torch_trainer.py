"""A cohort trainer made of plain PyTorch parts.

TorchTrainer serves a model, an optimizer, training and evaluation data
and a loss that a user wrote (Parts); it owns everything the contract asks
beyond them: the plan's picks (plan.Picker; pick p is sample p % samples),
the parameters as views of the arena (so averaging reads and writes the
model in place and Publish copies nothing for a model on the CPU),
blending, the learning-rate scale, evaluation and checkpoints, and errors
that name the user's file and line.
"""

import json
import math
import os
import sys
import time
import traceback

import torch

from . import arena
from .plan import Picker
from .service import LOAD_REPLACEMENT, SettingSpec, Trainer

# torch dtype -> arena dtype; anything else is refused at Configure.
_ARENA_DTYPES = {
    torch.float32: arena.arena_pb2.DTYPE_F32,
    torch.float64: arena.arena_pb2.DTYPE_F64,
    torch.bfloat16: arena.arena_pb2.DTYPE_BF16,
    torch.float16: arena.arena_pb2.DTYPE_F16,
    torch.int64: arena.arena_pb2.DTYPE_I64,
    torch.int32: arena.arena_pb2.DTYPE_I32,
}
# A checkpoint is two files: the tensors (torch.save of a flat dict, which
# torch.load reads with weights_only) and the JSON that places them.
CHECKPOINT_TENSORS = "trainer-tensors.pt"
CHECKPOINT_META = "trainer.json"
CHECKPOINT_FORMAT = "cohort-pytorch/1"
MAX_CHECKPOINT_META = 64 << 20
_NORM_EVERY = 10  # batches between the parameter norms Train reports


class UserError(Exception):
    """An error in the user's code, named by file and line."""


def user_call(origin, what, fn, *args):
    """fn(*args); an exception becomes a UserError naming origin's line."""
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        raise UserError(describe_user_error(origin, what, e)) from e


def describe_user_error(origin, what, e):
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if origin and os.path.abspath(f.filename) == origin]
    where = ("%s:%d" % (mine[-1].filename, mine[-1].lineno)) if mine else (origin or "the trainer's code")
    if isinstance(e, SyntaxError) and e.filename:
        where = "%s:%s" % (e.filename, e.lineno)
    return "%s: %s raised %s: %s" % (where, what, type(e).__name__, e)


def where_defined(fn, origin):
    """file:line of fn's definition when the user's file defines it, else origin."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "forward", None), "__code__", None)
    if code is not None and origin and os.path.abspath(code.co_filename) == origin:
        return "%s:%d" % (code.co_filename, code.co_firstlineno)
    return origin


def _write_atomic(path, write):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _encode(v, tensors):
    """v as JSON, its tensors replaced by their index in tensors."""
    if isinstance(v, torch.Tensor):
        tensors.append(v.detach().cpu())
        return {"tensor": len(tensors) - 1}
    if isinstance(v, dict):
        return {"dict": [[_encode(k, tensors), _encode(x, tensors)] for k, x in v.items()]}
    if isinstance(v, tuple):
        return {"tuple": [_encode(x, tensors) for x in v]}
    if isinstance(v, list):
        return {"list": [_encode(x, tensors) for x in v]}
    if v is None or isinstance(v, (bool, int, str)):
        return {"v": v}
    if isinstance(v, float):
        return {"f": v.hex()}  # exact, NaN and infinities included
    raise TypeError("cannot keep a %s in a checkpoint" % type(v).__name__)


def _decode(v, tensors, where):
    if not isinstance(v, dict) or len(v) < 1:
        raise ValueError("checkpoint %s: malformed entry %r" % (where, v))
    if "tensor" in v:
        t = tensors.get("t%d" % v["tensor"]) if isinstance(v["tensor"], int) else None
        if not isinstance(t, torch.Tensor):
            raise ValueError("checkpoint %s: names a tensor the tensor file lacks" % where)
        return t
    if "dict" in v:
        return {_decode(k, tensors, where): _decode(x, tensors, where) for k, x in v["dict"]}
    if "tuple" in v:
        return tuple(_decode(x, tensors, where) for x in v["tuple"])
    if "list" in v:
        return [_decode(x, tensors, where) for x in v["list"]]
    if "f" in v:
        return float.fromhex(v["f"])
    if "v" in v:
        return v["v"]
    raise ValueError("checkpoint %s: malformed entry %r" % (where, v))


class Parts:
    """What a user supplies, read from any object or module with these names:

    model(cfg) -> torch.nn.Module            (under torch.manual_seed(cfg.seed))
    optimizer(params, cfg) -> torch.optim.Optimizer
    data(cfg) -> (train, eval)               each a Dataset, or a tuple of
                                             tensors (features, targets); eval may be None
    loss(output, target) -> scalar tensor
    batch_size                               an int (default 64)
    epoch_end(model, epoch), optional        runs after an epoch's evaluation
    state() -> dict / load_state(dict), optional: extra checkpoint state
    """

    REQUIRED = ("model", "optimizer", "data", "loss")

    def __init__(self, source, origin):
        missing = [n for n in self.REQUIRED if not callable(getattr(source, n, None))]
        if missing:
            raise UserError("%s does not define %s (a trainer needs %s)" % (
                origin, ", ".join(missing), ", ".join(self.REQUIRED)))
        self.source, self.origin = source, origin

    def get(self, name, default=None):
        return getattr(self.source, name, default)


class RunConfig:
    """What the user's functions get: the rank, the run and their args."""

    def __init__(self, cfg, args):
        self.rank, self.world_size, self.local_ranks = cfg.rank, cfg.world_size, cfg.local_ranks
        self.seed, self.args = cfg.seed, args


def _dataset_len(ds):
    return int(ds[0].shape[0]) if isinstance(ds, tuple) else len(ds)


def _gather(ds, idx):
    """The samples idx names: an index_select on tensors, else collated."""
    if isinstance(ds, tuple):
        t = torch.as_tensor(idx, dtype=torch.int64)
        return tuple(x.index_select(0, t) for x in ds)
    from torch.utils.data import default_collate  # noqa: PLC0415
    return default_collate([ds[i] for i in idx])


def _target_summary(y):
    if isinstance(y, torch.Tensor) and not y.is_floating_point() and y.numel():
        return "labels %d to %d" % (int(y.min()), int(y.max()))
    return "dtype %s" % getattr(y, "dtype", type(y).__name__)


def _check_tensors(name, ds, origin):
    if ds is None or not isinstance(ds, tuple):
        return
    if len(ds) != 2 or not all(isinstance(t, torch.Tensor) for t in ds):
        raise UserError("%s: data() must return datasets or (features, targets) tensor pairs; %s is a tuple of %s" % (
            origin, name, [type(t).__name__ for t in ds]))
    if ds[0].shape[0] != ds[1].shape[0]:
        raise UserError("%s: %s data has %d feature rows but %d targets" % (origin, name, ds[0].shape[0], ds[1].shape[0]))


class TorchTrainer(Trainer):
    """A trainer (service.Trainer) over user Parts.

    load(settings_dict) -> Parts reads the plugin's own keys (extra_settings)
    and finds the user's parts; the keys below are TorchTrainer's own.
    """

    SETTINGS = [
        SettingSpec("batch_size", "integer", "samples a step (default: the user's batch_size, else 64)"),
        SettingSpec("eval_batch_size", "integer", "samples a forward pass in Evaluate (default 1000)"),
        SettingSpec("threads", "integer", "intra-op threads; 0: cores / ranks on this host"),
        SettingSpec("args", "object", "passed to the user's functions as cfg.args"),
    ]

    def __init__(self, name, version, load, extra_settings=(), capabilities=("pytorch",), check=None):
        """check(settings) -> [(key, message)], when set, refuses what the
        schema cannot (a file that is not there), without running the
        user's code."""
        self.name, self.version, self.load, self.check = name, version, load, check
        self.settings_schema = list(extra_settings) + self.SETTINGS
        self.capabilities = list(capabilities)
        self.model = None

    # --- Describe, Configure --------------------------------------------

    def describe(self):
        return {"name": self.name, "version": self.version, "capabilities": self.capabilities,
                "settings": self.settings_schema}

    def settings_problems(self, raw):
        """(settings, [(key, message)]): every value of the block the schema
        or the plugin's own check refuses; key "" is the block as a whole."""
        try:
            s = json.loads(raw.decode() or "{}") if raw else {}
        except ValueError as e:
            return None, [("", "not JSON: %s" % e)]
        if not isinstance(s, dict):
            return None, [("", "want an object, got %s" % type(s).__name__)]
        problems = []
        known = {spec.key: spec for spec in self.settings_schema}
        for k, v in s.items():
            if k not in known:
                problems.append((k, "unknown key (known: %s)" % ", ".join(sorted(known))))
                continue
            want = known[k].type
            ok = {"integer": isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                  "string": isinstance(v, str), "object": isinstance(v, dict),
                  "number": isinstance(v, (int, float)) and not isinstance(v, bool),
                  "bool": isinstance(v, bool)}.get(want, True)
            if not ok:
                problems.append((k, "must be a%s %s, got %s" % (
                    " non-negative" if want == "integer" else "n" if want[0] in "aeiou" else "", want, json.dumps(v))))
        for spec in self.settings_schema:
            if spec.required and spec.key not in s:
                problems.append((spec.key, "required (%s)" % spec.doc))
        # The plugin's own check reads the required keys; it runs when they
        # are sound, whatever else is wrong, so every mistake shows at once.
        bad = {k for k, _ in problems}
        if self.check is not None and not any(spec.required and spec.key in bad for spec in self.settings_schema):
            problems.extend(self.check(s))
        return s, problems

    def check_settings(self, raw):
        """CheckSettings: the block's problems, loading and training nothing."""
        return self.settings_problems(raw)[1]

    def _settings(self, raw):
        s, problems = self.settings_problems(raw)
        if problems:
            raise ValueError("trainer settings: " + "; ".join(
                "%s: %s" % (k, m) if k else m for k, m in problems))
        return s

    def configure(self, cfg):
        s = self._settings(cfg.settings)
        parts = self.load(s)
        o = parts.origin
        self.parts, self.origin = parts, o
        threads = s.get("threads", 0) or max(1, (os.cpu_count() or 1) // max(1, cfg.local_ranks))
        torch.set_num_threads(threads)
        run = RunConfig(cfg, s.get("args", {}))
        self.run = run
        torch.manual_seed(cfg.seed)
        model = user_call(o, "model(cfg)", parts.get("model"), run)
        if not isinstance(model, torch.nn.Module):
            raise UserError("%s: model(cfg) must return a torch.nn.Module, got %s" % (o, type(model).__name__))
        data = user_call(o, "data(cfg)", parts.get("data"), run)
        if not (isinstance(data, (tuple, list)) and len(data) == 2):
            raise UserError("%s: data(cfg) must return (train, eval), got %s" % (o, type(data).__name__))
        train, evals = data
        for name, ds in (("training", train), ("evaluation", evals)):
            _check_tensors(name, ds, o)
        n = _dataset_len(train)
        if n == 0:
            raise UserError("%s: data(cfg) returned no training samples" % o)
        bs = s.get("batch_size") or parts.get("batch_size", 64)
        if not isinstance(bs, int) or bs <= 0:
            raise UserError("%s: batch_size must be a positive int, got %r" % (o, bs))
        self.loss_fn = parts.get("loss")
        self.entries, self.size, self.tensors = self._layout(model)
        # The model's output must fit the targets: one step's forward and
        # loss on two samples, before any rank starts training.
        x, y = _gather(train, [0, min(1, n - 1)])
        # The probe leaves no trace: buffers (batch norm's statistics) and
        # the RNG (dropout) are as the model built them.
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        rng = torch.get_rng_state()
        try:
            self._probe(model, x, y, o)
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            torch.set_rng_state(rng)
        self.model, self.train_data, self.eval_data = model, train, evals
        self.batch_size, self.eval_batch_size = bs, s.get("eval_batch_size") or 1000
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = user_call(o, "optimizer(params, cfg)", parts.get("optimizer"), params, run)
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise UserError("%s: optimizer(params, cfg) must return a torch.optim.Optimizer, got %s" % (
                o, type(self.optimizer).__name__))
        self.picker = Picker()
        self.step_count = self.published_steps = 0
        self.published = None
        self.zero_copy = False
        self.mapping = None
        return {"entries": self.entries, "size": self.size, "samples": n,
                "eval_samples": _dataset_len(evals) if evals is not None else 0, "batch_size": bs,
                "adaptive_optimizer": adaptive_optimizer(self.optimizer)}

    def _probe(self, model, x, y, o):
        """One forward and loss on two samples: the output must fit the targets."""
        with torch.no_grad():
            out = user_call(o, "the model's forward", model, x)
            try:
                loss = self.loss_fn(out, y)
            except Exception as e:  # noqa: BLE001 - the user's loss may raise anything
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise UserError("%s: the model's output does not fit the targets: on two training samples it "
                                "returned %s for targets %s (%s), and loss(output, target) raised %s: %s" % (
                                    where_defined(self.loss_fn, o), shape, tuple(y.shape),
                                    _target_summary(y), type(e).__name__, e)) from e
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise UserError("%s: loss(output, target) must return a scalar tensor, got %r" % (o, loss))

    def _layout(self, model):
        """Every parameter, then every buffer, as arena entries."""
        entries, tensors, seen = [], [], set()
        named = [(n, t, arena.PARAMETER) for n, t in model.named_parameters()]
        named += [(n, t, arena.BUFFER) for n, t in model.named_buffers()]
        for name, t, role in named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.dtype not in _ARENA_DTYPES:
                kind = "parameter" if role == arena.PARAMETER else "buffer"
                raise UserError("%s: the model's %s %r is %s; the arena holds float32, float64, bfloat16, "
                                "float16, int64 and int32 tensors only" % (self.origin, kind, name, t.dtype))
            entries.append(arena.Entry(name, _ARENA_DTYPES[t.dtype], t.shape, role))
            tensors.append(t)
        if not entries:
            raise UserError("%s: the model has no parameters or buffers" % self.origin)
        entries, size = arena.pack(entries)
        return entries, size, tensors

    # --- the arena ------------------------------------------------------

    def attach(self, path, layout):
        if self.model is None:
            raise RuntimeError("Attach before Configure")
        if not arena.same_layout(self.entries, self.size, layout):
            raise arena.LayoutError("the arena's layout is not the one Configure returned")
        self.mapping = arena.Mapping(path, self.size)
        self.views = []
        zero_copy = True
        for e, t in zip(self.entries, self.tensors):
            if e.nbytes:
                v = torch.frombuffer(self.mapping.buf, dtype=t.dtype, count=e.elements(), offset=e.offset).view(t.shape)
            else:  # frombuffer refuses an empty view
                v = torch.empty(t.shape, dtype=t.dtype)
            with torch.no_grad():
                v.copy_(t.detach())
            self.views.append(v)
            if t.device.type == "cpu":
                # The model's tensor now lives in the arena: set_data keeps
                # the Parameter object the optimizer holds. A tensor that was
                # not contiguous becomes a contiguous one of the same shape.
                t.data = v
            else:
                zero_copy = False
        self.zero_copy = zero_copy
        self.host_copy_bytes = 0
        self._snapshot()
        return zero_copy

    def _float_pairs(self):
        return [(t, v) for t, v in zip(self.tensors, self.views) if t.is_floating_point()]

    def _snapshot(self):
        """Keeps the published values, for a blending Adopt."""
        self.published = [t.detach().clone() for t, _ in self._float_pairs()]

    def _norm(self):
        with torch.no_grad():
            s = 0.0
            for e, t in zip(self.entries, self.tensors):
                if e.role == arena.PARAMETER and t.is_floating_point():
                    s += float(t.detach().double().pow(2).sum())
        return math.sqrt(s)

    def _need_arena(self, what):
        if self.mapping is None:
            raise RuntimeError("%s before Attach" % what)

    def publish(self):
        self._need_arena("Publish")
        with torch.no_grad():
            if not self.zero_copy:
                for e, t, v in zip(self.entries, self.tensors, self.views):
                    if t.device.type != "cpu":
                        v.copy_(t.detach())
                        self.host_copy_bytes += e.nbytes
            self._snapshot()
        steps = self.step_count - self.published_steps
        self.published_steps = self.step_count
        copied, self.host_copy_bytes = self.host_copy_bytes, 0
        return {"steps": steps, "step_count": self.step_count, "param_norm": self._norm(), "host_copy_bytes": copied}

    def adopt(self, alpha):
        self._need_arena("Adopt")
        with torch.no_grad():
            for e, t, v in zip(self.entries, self.tensors, self.views):
                if t.device.type != "cpu":
                    t.copy_(v)
                    self.host_copy_bytes += e.nbytes
            if 0 < alpha < 1 and self.published is not None:
                # (1-a)·published + a·arena, in place; the model reads the arena.
                for (t, _), pub in zip(self._float_pairs(), self.published):
                    t.mul_(alpha).add_(pub, alpha=1 - alpha)
                self._sync_views()
        return self._norm()

    def _sync_views(self):
        """Writes a model off the CPU back into the arena."""
        if not self.zero_copy:
            for t, v in zip(self.tensors, self.views):
                if t.device.type != "cpu":
                    v.copy_(t.detach())

    # --- Train, Evaluate --------------------------------------------------

    def train(self, plan):
        self._need_arena("Train")
        scale = plan.lr_multiplier()
        picks = self.picker.picks(plan.epoch, plan.seed, plan.pick_space, plan.offset, plan.size)
        n = _dataset_len(self.train_data)
        groups = self.optimizer.param_groups
        base = [g["lr"] for g in groups]
        model, o = self.model, self.origin
        model.train()
        try:
            for g, lr in zip(groups, base):
                g["lr"] = lr * scale
            for b, start in enumerate(range(0, len(picks), self.batch_size)):
                t0 = time.perf_counter()
                x, y = _gather(self.train_data, [p % n for p in picks[start:start + self.batch_size]])
                t1 = time.perf_counter()
                self.optimizer.zero_grad()
                out = user_call(o, "the model's forward", model, x)
                loss = user_call(o, "loss(output, target)", self.loss_fn, out, y)
                lv = float(loss.detach())
                if not math.isfinite(lv):
                    raise UserError("%s: loss(output, target) returned %s at batch %d of epoch %d (step %d)" % (
                        where_defined(self.loss_fn, o), lv, b, plan.epoch, self.step_count))
                user_call(o, "the backward pass", loss.backward)
                self.optimizer.step()
                self.step_count += 1
                t2 = time.perf_counter()
                r = {"batch": b, "samples": int(y.shape[0]) if hasattr(y, "shape") else len(y), "loss": lv,
                     "batch_ms": (t2 - t0) * 1e3, "data_ms": (t1 - t0) * 1e3, "step_count": self.step_count,
                     "scalars": {"lr": groups[0]["lr"]}}
                if b % _NORM_EVERY == 0:
                    r["param_norm"] = self._norm()
                self._sync_views()
                yield r
        finally:
            for g, lr in zip(groups, base):
                g["lr"] = lr

    def evaluate(self):
        if self.model is None:
            raise RuntimeError("Evaluate before Configure")
        ds = self.eval_data
        if ds is None:
            raise RuntimeError("%s: data(cfg) returned no evaluation data" % self.origin)
        n = _dataset_len(ds)
        total, correct, classify = 0.0, 0, True
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, n, self.eval_batch_size):
                    x, y = _gather(ds, list(range(start, min(n, start + self.eval_batch_size))))
                    out = user_call(self.origin, "the model's forward", self.model, x)
                    loss = user_call(self.origin, "loss(output, target)", self.loss_fn, out, y)
                    total += float(loss) * int(y.shape[0])
                    if classify and out.dim() == 2 and not y.is_floating_point() and y.dim() == 1:
                        correct += int((out.argmax(1) == y).sum())
                    else:
                        classify = False
        finally:
            self.model.train()
        return {"loss": total / max(n, 1), "accuracy": correct / n if classify and n else None, "samples": n}

    def epoch_end(self, epoch):
        hook = self.parts.get("epoch_end") if self.model is not None else None
        if hook is None:
            return False
        with torch.no_grad():
            user_call(self.origin, "epoch_end(model, epoch)", hook, self.model, epoch)
        self._sync_views()
        return True

    # --- checkpoints ------------------------------------------------------

    def save_checkpoint(self, d):
        self._need_arena("SaveCheckpoint")
        os.makedirs(d, exist_ok=True)
        state = {"params": {e.name: t.detach().cpu().clone() for e, t in zip(self.entries, self.tensors)},
                 "optimizer": self.optimizer.state_dict(), "step_count": self.step_count,
                 "rng": torch.get_rng_state()}
        hook = self.parts.get("state")
        if hook is not None:
            state["user"] = user_call(self.origin, "state()", hook)
        tensors = []
        try:
            meta = _encode(state, tensors)
        except TypeError as e:
            raise UserError("%s: state() must return tensors, numbers, strings, lists and dicts: %s" % (self.origin, e)) from e
        meta["format"] = CHECKPOINT_FORMAT
        # For people and tools that look into a checkpoint; load ignores them.
        meta["step_count"], meta["param_norm"] = self.step_count, self._norm()
        tpath, mpath = os.path.join(d, CHECKPOINT_TENSORS), os.path.join(d, CHECKPOINT_META)
        # Tensors first, the metadata that names them last: a checkpoint
        # without its metadata is no checkpoint.
        _write_atomic(tpath, lambda f: torch.save({"t%d" % i: t for i, t in enumerate(tensors)}, f))
        _write_atomic(mpath, lambda f: f.write(json.dumps(meta).encode()))
        return [tpath, mpath]

    def load_checkpoint(self, d, reason):
        self._need_arena("LoadCheckpoint")
        tpath, mpath = os.path.join(d, CHECKPOINT_TENSORS), os.path.join(d, CHECKPOINT_META)
        with open(mpath, "rb") as f:
            raw = f.read(MAX_CHECKPOINT_META + 1)
        if len(raw) > MAX_CHECKPOINT_META:
            raise ValueError("checkpoint %s: metadata over %d bytes" % (mpath, MAX_CHECKPOINT_META))
        try:
            meta = json.loads(raw)
        except ValueError as e:
            raise ValueError("checkpoint %s: %s" % (mpath, e)) from e
        if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
            raise ValueError("checkpoint %s: not a cohort PyTorch trainer's checkpoint" % mpath)
        # Tensors only: nothing in the file can run code as it loads.
        tensors = torch.load(tpath, map_location="cpu", weights_only=True)
        state = _decode(meta, tensors, mpath)
        if not isinstance(state, dict) or not {"params", "optimizer", "step_count"} <= set(state):
            raise ValueError("checkpoint %s: incomplete" % mpath)
        params = state["params"]
        with torch.no_grad():
            if reason != LOAD_REPLACEMENT:
                for e, t in zip(self.entries, self.tensors):
                    saved = params.get(e.name)
                    if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != tuple(t.shape) or saved.dtype != t.dtype:
                        raise ValueError("checkpoint %s: tensor %r is missing or of another shape or type" % (d, e.name))
                    t.copy_(saved)
                self._sync_views()
                if isinstance(state.get("rng"), torch.Tensor):
                    torch.set_rng_state(state["rng"])
        self.optimizer.load_state_dict(state["optimizer"])
        hook = self.parts.get("load_state")
        if hook is not None and "user" in state:
            user_call(self.origin, "load_state(state)", hook, state["user"])
        self.step_count = self.published_steps = int(state["step_count"])
        self._snapshot()
        return self.step_count, False

    def shutdown(self):
        sys.stderr.flush()


# torch's optimizers that scale each element's step by its own gradient
# history; getattr, since older torch lacks some of them.
_ADAPTIVE = tuple(c for c in (getattr(torch.optim, n, None) for n in (
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "SparseAdam", "Adafactor"))
    if isinstance(c, type))


def adaptive_optimizer(opt):
    """Whether opt is one of torch's adaptive optimizers (the coordinator
    aims its adaptive interval tighter for them); a user's own optimizer
    class says so with a truthy `cohort_adaptive` attribute."""
    flag = getattr(opt, "cohort_adaptive", None)
    if flag is not None:
        return bool(flag)
    return isinstance(opt, _ADAPTIVE)
