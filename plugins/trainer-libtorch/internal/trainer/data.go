package trainer

import (
	"context"
	"encoding/hex"
	"errors"
	"runtime/debug"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/hostshare"
)

// loadData returns the splits src names. The ranks of a host share one
// read-only image of them (hostshare): the first to ask loads the files
// and builds it, the others map it. Where no image can be shared (no
// memfd, no shared memory left for it) the trainer loads its own copy, as
// each did before images. img is the image the splits live in (nil for a
// private copy); its holder closes it when the splits are dropped.
func (t *Trainer) loadData(ctx context.Context, src dataset.Source) (train, eval *dataset.Set, img *hostshare.Image, err error) {
	id, err := src.Identity()
	if err != nil {
		// A file is missing or unreadable: Load says which.
		train, eval, err = dataset.Load(src)
		return train, eval, nil, err
	}
	var tr, ev *dataset.Set // loaded here, when this trainer builds the image
	img, err = hostshare.Acquire(ctx, hex.EncodeToString(id[:16]), func() (int, func([]byte), error) {
		raw := src
		raw.WidenMB = 0 // the image widens, straight into shared memory
		var err error
		if tr, ev, err = dataset.Load(raw); err != nil {
			return 0, nil, err
		}
		return dataset.ImageSize(tr, ev, src.WidenMB), func(dst []byte) {
			dataset.WriteImage(dst, id, tr, ev, src.WidenMB)
		}, nil
	})
	var buildErr *hostshare.BuildError
	switch {
	case errors.As(err, &buildErr):
		return nil, nil, nil, buildErr.Err
	case err != nil && tr != nil:
		// Loaded, but the host had no shared memory for it: keep it here
		// rather than load it again beside itself.
		t.logger.Warn("no shared copy of the data on this host: this rank keeps its own", "error", err)
		tr.Widen(src.WidenMB)
		return tr, ev, nil, nil
	case err != nil:
		t.logger.Warn("no shared copy of the data on this host: loading this rank's own", "error", err)
		train, eval, err = dataset.Load(src)
		return train, eval, nil, err
	}
	if img.Built {
		// The files' bytes, decoded on the Go heap, are garbage now: give
		// them back rather than keep a second copy of the data set.
		tr, ev = nil, nil
		debug.FreeOSMemory()
	}
	train, eval, err = dataset.ReadImage(img.Map.Bytes(), id, img.Map)
	if err != nil {
		img.Close()
		return nil, nil, nil, err
	}
	t.logger.Debug("data", "shared_image_bytes", len(img.Map.Bytes()), "built_here", img.Built)
	return train, eval, img, nil
}
