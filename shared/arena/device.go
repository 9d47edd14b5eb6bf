package arena

import "fmt"

// DeviceBlock is a trainer's parameters kept on a GPU, for an averager of
// the same host to map (CUDA IPC) and average in place, so no parameter
// crosses to the host in a round. The block holds the layout's f32
// parameters, then its f32 buffers, each in layout order and packed; other
// entries stay in the arena. A trainer that exported one keeps it current
// from Publish to Adopt as it would the arena (plugin.DeviceExporter).
type DeviceBlock struct {
	// GPU names the block's GPU the same in every process of its host:
	// the host's boot id, "/", and the GPU's PCI bus id.
	GPU string
	// Handle is the block's cudaIpcMemHandle_t.
	Handle [64]byte
	// Size is the block's bytes: 4 per f32 element of the layout's
	// parameters and buffers (DeviceBytes).
	Size uint64
}

// DeviceBytes is the size of a layout's DeviceBlock: its f32 parameters
// and f32 buffers.
func (l Layout) DeviceBytes() uint64 {
	var n uint64
	for _, e := range l.Entries {
		if e.DType == F32 {
			n += e.Bytes
		}
	}
	return n
}

// CheckDevice refuses a block that cannot be this layout's.
func (l Layout) CheckDevice(b DeviceBlock) error {
	switch {
	case b.GPU == "":
		return fmt.Errorf("device block names no GPU")
	case b.Size != l.DeviceBytes():
		return fmt.Errorf("device block of %d bytes for a layout of %d bytes of f32 entries", b.Size, l.DeviceBytes())
	}
	return nil
}
