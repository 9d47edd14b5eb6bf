"""cohort-trainer-pytorch's Python side: serves the user's PyTorch file.

The Go launcher runs this (from a zip of it and cohort_plugin it hands the
interpreter); Configure's `file` names the user's Python file, which
defines model(cfg), optimizer(params, cfg), data(cfg) and loss(output,
target) as cohort_plugin.torch_trainer.Parts describes.
"""

import importlib.util
import os
import sys

import cohort_plugin
from cohort_plugin.service import SettingSpec

NAME = "trainer-pytorch"
VERSION = os.environ.get("COHORT_TRAINER_PYTORCH_VERSION", cohort_plugin.__version__)
FILE_SETTING = SettingSpec("file", "string", "the Python file that defines model, optimizer, data and loss",
                           required=True)


MAX_FILE_BYTES = 16 << 20


def check(settings):
    """The file is there and is Python: compiled, not run."""
    path = os.path.abspath(settings["file"])
    if not os.path.isfile(path):
        return [("file", "%s: no such file (a relative path is from the run's working directory)" % path)]
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_FILE_BYTES + 1)
        if len(source) > MAX_FILE_BYTES:
            return [("file", "%s: over %d bytes" % (path, MAX_FILE_BYTES))]
        compile(source, path, "exec")
    except SyntaxError as e:
        return [("file", "%s:%s: %s" % (path, e.lineno, e.msg))]
    except (OSError, ValueError) as e:
        return [("file", "%s: %s" % (path, e))]
    return []


def load(settings):
    from cohort_plugin.torch_trainer import Parts, UserError, describe_user_error

    path = os.path.abspath(settings["file"])
    if not os.path.isfile(path):
        raise UserError("trainer file %s: no such file (a relative path is from the run's working directory)" % path)
    spec = importlib.util.spec_from_file_location("cohort_user_trainer", path)
    module = importlib.util.module_from_spec(spec)
    # The user's file imports its neighbours as a script would.
    here = os.path.dirname(path)
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may raise anything
        raise UserError(describe_user_error(path, "loading the file", e)) from e
    return Parts(module, path)


def main():
    def build(_log):
        from cohort_plugin.torch_trainer import TorchTrainer

        return TorchTrainer(NAME, VERSION, load, extra_settings=[FILE_SETTING], check=check)

    cohort_plugin.serve(build, name=NAME)


main()
