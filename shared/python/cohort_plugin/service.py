"""The cohort.v1.Trainer gRPC service over a Python trainer.

A trainer is any object with the methods of Trainer below; TrainerService
converts requests to plain Python values and replies back, and carries
errors across as Go's SDK does: a trainer's exception travels as status
UNKNOWN with its text, a request that does not convert as
INVALID_ARGUMENT, an optional method the trainer lacks as UNIMPLEMENTED.
"""

import math
import threading
import time

import grpc

from ._pb import trainer_pb2

# The most problems one CheckSettings answer lists (Go:
# plugin.MaxSettingProblems).
MAX_SETTING_PROBLEMS = 1024

# The most reports one merged TrainReports holds (Go: maxMergedReports).
MAX_MERGED_REPORTS = 1024

# Why LoadCheckpoint is called (Go: plugin.LoadReason).
LOAD_RESUME = trainer_pb2.LOAD_REASON_RESUME
LOAD_REPLACEMENT = trainer_pb2.LOAD_REASON_REPLACEMENT


class Config:
    """TrainerConfig: who this rank is, the run's seed, the config block."""

    def __init__(self, rank, world_size, local_ranks, seed, settings, overlap_rounds):
        self.rank, self.world_size, self.local_ranks = rank, world_size, local_ranks
        self.seed, self.settings, self.overlap_rounds = seed, settings, overlap_rounds


class Plan:
    """One slice of an epoch's shared permutation (Go: plugin.Plan).

    report_merge is how long, in seconds, TrainerService may hold the
    plan's batch reports to send them together (protocol 4; 0: none); a
    trainer need not read it.
    """

    def __init__(self, epoch, offset, size, seed, pick_space, global_step, lr_scale, report_merge=0.0):
        self.epoch, self.offset, self.size, self.seed = epoch, offset, size, seed
        self.pick_space, self.global_step, self.lr_scale = pick_space, global_step, lr_scale
        self.report_merge = report_merge

    def lr_multiplier(self):
        s = self.lr_scale
        if s == 0:
            return 1.0
        if s > 0 and not math.isinf(s) and not math.isnan(s):
            return s
        raise ValueError("learning-rate scale %r, want a finite number above 0" % s)


class SettingSpec:
    """One key of the plugin's config block (Go: plugin.SettingSpec)."""

    def __init__(self, key, type, doc, required=False):  # noqa: A002 - the proto's name
        self.key, self.type, self.doc, self.required = key, type, doc, required


class Trainer:
    """What TrainerService serves; the methods mirror Go's plugin.Trainer.

    describe() -> dict(name, version, capabilities, settings: [SettingSpec])
    check_settings(settings_json) -> [(key, message)] (optional)
    configure(Config) -> dict(entries, size, samples, eval_samples, batch_size,
                              adaptive_optimizer: optional, False when absent)
    attach(path, layout) -> zero_copy
    train(Plan) -> iterator of BatchReport dicts; closing it stops training
    publish() -> dict(steps, step_count, param_norm, host_copy_bytes)
    adopt(alpha) -> param_norm
    evaluate() -> dict(loss, accuracy or None, samples)
    save_checkpoint(dir) -> [files]
    load_checkpoint(dir, reason) -> (step_count, checkpoint_params)
    epoch_end(epoch) -> ran (optional)
    shutdown()
    """


def _fail(context, code, msg):
    context.abort(code, msg)


class TrainerService:
    """cohort.v1.Trainer on impl. Calls but Shutdown are serialized."""

    def __init__(self, impl, log, load_reasons=True):
        self.impl, self.log, self.load_reasons = impl, log, load_reasons
        self.mu = threading.Lock()

    def _call(self, context, method, fn):
        try:
            with self.mu:
                return fn()
        except grpc.RpcError:
            raise
        except Exception as e:  # noqa: BLE001 - every error crosses as the Go SDK's do
            self.log.debug("call failed", extra={"kv": {"method": method, "error": str(e)}})
            _fail(context, grpc.StatusCode.UNKNOWN, str(e) or type(e).__name__)

    def Describe(self, request, context):
        d = self._call(context, "Describe", self.impl.describe)
        return trainer_pb2.PluginDescription(
            name=d["name"], version=d["version"], capabilities=list(d.get("capabilities", ())),
            settings_declared=d.get("settings") is not None,
            settings=[trainer_pb2.SettingSpec(key=s.key, type=s.type, required=s.required, doc=s.doc)
                      for s in d.get("settings") or ()])

    def CheckSettings(self, request, context):
        check = getattr(self.impl, "check_settings", None)
        if check is None:
            # The host then checks the block against the declared schema alone.
            _fail(context, grpc.StatusCode.UNIMPLEMENTED, "this trainer checks its settings only in Configure")
        problems = self._call(context, "CheckSettings", lambda: check(bytes(request.settings_json)))
        return trainer_pb2.CheckSettingsResponse(problems=[
            trainer_pb2.SettingProblem(key=k, message=m) for k, m in problems[:MAX_SETTING_PROBLEMS]])

    def Configure(self, request, context):
        cfg = Config(request.rank, request.world_size, request.local_ranks, request.seed,
                     bytes(request.settings_json), request.overlap_rounds)
        s = self._call(context, "Configure", lambda: self.impl.configure(cfg))
        from .arena import layout_pb
        return trainer_pb2.TrainerConfigureResponse(
            layout=layout_pb(s["entries"], s["size"]), samples=s["samples"],
            eval_samples=s["eval_samples"], batch_size=s["batch_size"],
            adaptive_optimizer=bool(s.get("adaptive_optimizer", False)))

    def Attach(self, request, context):
        if not request.HasField("arena") or not request.arena.path:
            _fail(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid Attach request: no arena")
        zc = self._call(context, "Attach", lambda: self.impl.attach(request.arena.path, request.arena.layout))
        return trainer_pb2.AttachResponse(zero_copy=bool(zc))

    def Train(self, request, context):
        plan = Plan(request.epoch, request.partition_offset, request.partition_size, request.seed,
                    request.pick_space, request.global_step, request.lr_scale,
                    request.report_merge_ms / 1000.0)
        reports = self._call(context, "Train", lambda: self.impl.train(plan))
        # Reports go as they come unless the host let them merge
        # (report_merge_ms, protocol 4): then one message an interval, and
        # what is held goes before Train ends, its error included.
        pending, last = [], time.monotonic()
        try:
            while True:
                # Each batch under the lock: Shutdown is the only call that
                # may come while a plan runs (it does not take the lock).
                try:
                    with self.mu:
                        r = next(reports, None)
                except Exception as e:  # noqa: BLE001
                    if pending and context.is_active():
                        yield trainer_pb2.TrainReports(reports=pending)
                    _fail(context, grpc.StatusCode.UNKNOWN, str(e) or type(e).__name__)
                if r is None:
                    if pending and context.is_active():
                        yield trainer_pb2.TrainReports(reports=pending)
                    return
                msg = trainer_pb2.BatchReport(
                    batch=r["batch"], samples=r["samples"], loss=r["loss"], batch_ms=r["batch_ms"],
                    data_ms=r["data_ms"], step_count=r["step_count"], round_wait_ms=r.get("round_wait_ms", 0.0))
                if r.get("param_norm") is not None:
                    msg.param_norm = r["param_norm"]
                for k, v in (r.get("scalars") or {}).items():
                    msg.scalars[k] = v
                if not context.is_active():
                    return
                pending.append(msg)
                if plan.report_merge > 0 and len(pending) < MAX_MERGED_REPORTS and \
                        time.monotonic() - last < plan.report_merge:
                    continue
                yield trainer_pb2.TrainReports(reports=pending)
                pending, last = [], time.monotonic()
        finally:
            reports.close()

    def Publish(self, request, context):
        r = self._call(context, "Publish", self.impl.publish)
        return trainer_pb2.PublishResponse(steps=r["steps"], step_count=r["step_count"],
                                           param_norm=r["param_norm"], host_copy_bytes=r["host_copy_bytes"])

    def Adopt(self, request, context):
        a = request.blend_alpha
        if not (0 <= a <= 1):  # NaN fails too
            _fail(context, grpc.StatusCode.UNKNOWN, "blend alpha %r outside [0, 1]" % a)
        return trainer_pb2.AdoptResponse(param_norm=self._call(context, "Adopt", lambda: self.impl.adopt(a)))

    def Evaluate(self, request, context):
        r = self._call(context, "Evaluate", self.impl.evaluate)
        out = trainer_pb2.EvaluateResponse(loss=r["loss"], samples=r["samples"])
        if r.get("accuracy") is not None:
            out.accuracy = r["accuracy"]
        return out

    def SaveCheckpoint(self, request, context):
        if not request.dir:
            _fail(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid SaveCheckpoint request: no directory")
        files = self._call(context, "SaveCheckpoint", lambda: self.impl.save_checkpoint(request.dir))
        return trainer_pb2.SaveCheckpointResponse(files=files)

    def LoadCheckpoint(self, request, context):
        if not request.dir:
            _fail(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid LoadCheckpoint request: no directory")
        reason = request.reason if self.load_reasons else LOAD_RESUME
        if reason == trainer_pb2.LOAD_REASON_UNSPECIFIED:
            reason = LOAD_RESUME  # a host before protocol 3
        if reason not in (LOAD_RESUME, LOAD_REPLACEMENT):
            _fail(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid LoadCheckpoint request: reason %d" % reason)
        steps, ckpt = self._call(context, "LoadCheckpoint", lambda: self.impl.load_checkpoint(request.dir, reason))
        return trainer_pb2.LoadCheckpointResponse(step_count=steps, checkpoint_params=bool(ckpt))

    def EpochEnd(self, request, context):
        hook = getattr(self.impl, "epoch_end", None)
        ran = self._call(context, "EpochEnd", lambda: hook(request.epoch) if hook else None)
        if ran is None:
            _fail(context, grpc.StatusCode.UNIMPLEMENTED, "this trainer has no end-of-epoch code")
        return trainer_pb2.EpochEndResponse(ran=bool(ran))

    def ExportDevice(self, request, context):
        _fail(context, grpc.StatusCode.UNIMPLEMENTED, "this trainer keeps its parameters in the arena")

    def Shutdown(self, request, context):
        try:
            self.impl.shutdown()
        except Exception as e:  # noqa: BLE001
            _fail(context, grpc.StatusCode.UNKNOWN, str(e))
        return trainer_pb2.ShutdownResponse()
