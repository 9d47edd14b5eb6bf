package main

import (
	"strings"
	"testing"
)

// What the Python trainer reads from files, an IDX data file and a
// checkpoint's metadata, cut short, bit-flipped or made up, is refused
// with an error of the reader's own kinds, never anything else (a crash,
// a huge allocation, an unrelated exception). The mutations are seeded,
// so a failure repeats.
func TestDecodersRefuseGarbage(t *testing.T) {
	const script = `import gzip, io, json, os, random, struct, sys, tempfile
import torch
from cohort_plugin.data import load_idx
from cohort_plugin.torch_trainer import _decode, _encode

rng = random.Random(1)
d = tempfile.mkdtemp()
good = struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", 4, 3, 2) + bytes(range(24))
path = os.path.join(d, "x")
bad = 0
for i in range(600):
    b = bytearray(good)
    kind = i % 4
    if kind == 0:
        b = b[:rng.randrange(len(b))]
    elif kind == 1:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 2:
        b[4:8] = struct.pack(">I", rng.choice([0xFFFFFFFF, 1 << 30, 5]))
    else:
        b = bytearray(rng.randbytes(rng.randrange(40)))
    data = gzip.compress(bytes(b)) if i % 2 else bytes(b)
    if i % 3 == 0 and i % 2:  # a gzip stream broken too
        data = bytearray(data)
        data[rng.randrange(10, len(data))] ^= 1 << rng.randrange(8)
    with open(path, "wb") as f:
        f.write(data)
    try:
        load_idx(path)
    except ValueError:
        bad += 1
    except Exception as e:
        sys.exit("load_idx on mutation %d: %s: %s" % (i, type(e).__name__, e))

tensors = []
meta = json.dumps(_encode({"a": [1, 2.5, (3, None)], "t": torch.ones(2)}, tensors))
table = {"t%d" % i: t for i, t in enumerate(tensors)}
for i in range(600):
    s = list(meta)
    for _ in range(rng.randrange(1, 4)):
        s[rng.randrange(len(s))] = rng.choice('{}[]":,0123456789abcdeftxlsvn ')
    try:
        _decode(json.loads("".join(s)), table, "fuzz")
    except (ValueError, TypeError, KeyError, IndexError):
        pass
    except Exception as e:
        sys.exit("_decode on mutation %d: %s: %s" % (i, type(e).__name__, e))
print("ok", bad)`
	out := string(runPython(t, script))
	if !strings.HasPrefix(out, "ok ") {
		t.Fatalf("the decoders' run said %q", out)
	}
}
