package wire

import (
	"errors"
	"fmt"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

// Encode returns the frame kind of msg and its protobuf encoding (with
// deterministic map order). msg must be one of the message types that
// wire.proto's FrameKind names.
func Encode(msg proto.Message) (wirepb.FrameKind, []byte, error) {
	kind := kindOf(msg)
	if kind == wirepb.FrameKind_FRAME_KIND_UNSPECIFIED {
		if msg == nil || !msg.ProtoReflect().IsValid() {
			return 0, nil, errors.New("wire: cannot encode a nil message")
		}
		return 0, nil, fmt.Errorf("wire: %s is not a control message", msg.ProtoReflect().Descriptor().FullName())
	}
	if !msg.ProtoReflect().IsValid() {
		return 0, nil, fmt.Errorf("wire: cannot encode a nil %s", kind)
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return 0, nil, fmt.Errorf("wire: encode %s: %w", kind, err)
	}
	return kind, payload, nil
}

// Decode parses payload as the message type that kind names. An unknown kind
// wraps authframe.ErrUnknownKind; a payload that does not parse is an error naming the
// kind.
func Decode(kind wirepb.FrameKind, payload []byte) (proto.Message, error) {
	msg := newMessage(kind)
	if msg == nil {
		return nil, fmt.Errorf("wire: %w: %d", authframe.ErrUnknownKind, uint32(kind))
	}
	if err := proto.Unmarshal(payload, msg); err != nil {
		return nil, fmt.Errorf("wire: decode %s payload (%d bytes): %w", kind, len(payload), err)
	}
	return msg, nil
}

// newMessage returns an empty message of the type kind names, or nil for a
// kind wire.proto does not list. It is the one place that lists the kinds: a
// frame reader accepts exactly the kinds it knows.
func newMessage(kind wirepb.FrameKind) proto.Message {
	switch kind {
	case wirepb.FrameKind_FRAME_KIND_START_EPOCH:
		return new(wirepb.StartEpoch)
	case wirepb.FrameKind_FRAME_KIND_SYNC:
		return new(wirepb.Sync)
	case wirepb.FrameKind_FRAME_KIND_UPDATE:
		return new(wirepb.Update)
	case wirepb.FrameKind_FRAME_KIND_THROTTLE:
		return new(wirepb.Throttle)
	case wirepb.FrameKind_FRAME_KIND_SET_GLOBAL_STEP:
		return new(wirepb.SetGlobalStep)
	case wirepb.FrameKind_FRAME_KIND_CHECKPOINT:
		return new(wirepb.Checkpoint)
	case wirepb.FrameKind_FRAME_KIND_EVALUATE:
		return new(wirepb.Evaluate)
	case wirepb.FrameKind_FRAME_KIND_EXTEND_PARTITION:
		return new(wirepb.ExtendPartition)
	case wirepb.FrameKind_FRAME_KIND_DECLARE_DEAD:
		return new(wirepb.DeclareDead)
	case wirepb.FrameKind_FRAME_KIND_REQUEST_SESSION_ID:
		return new(wirepb.RequestSessionId)
	case wirepb.FrameKind_FRAME_KIND_NEW_SESSION:
		return new(wirepb.NewSession)
	case wirepb.FrameKind_FRAME_KIND_SET_EPOCH_CALLBACK_ROLE:
		return new(wirepb.SetEpochCallbackRole)
	case wirepb.FrameKind_FRAME_KIND_SHUTDOWN:
		return new(wirepb.Shutdown)
	case wirepb.FrameKind_FRAME_KIND_SHUTDOWN_WITH_SAVE:
		return new(wirepb.ShutdownWithSave)
	case wirepb.FrameKind_FRAME_KIND_COORDINATOR_HEARTBEAT:
		return new(wirepb.CoordinatorHeartbeat)
	case wirepb.FrameKind_FRAME_KIND_ADMIT:
		return new(wirepb.Admit)
	case wirepb.FrameKind_FRAME_KIND_MEETING:
		return new(wirepb.Meeting)
	case wirepb.FrameKind_FRAME_KIND_RELAY_RESULT:
		return new(wirepb.RelayResult)
	case wirepb.FrameKind_FRAME_KIND_EPOCH_END:
		return new(wirepb.EpochEnd)

	case wirepb.FrameKind_FRAME_KIND_READY:
		return new(wirepb.Ready)
	case wirepb.FrameKind_FRAME_KIND_BATCH:
		return new(wirepb.Batch)
	case wirepb.FrameKind_FRAME_KIND_SYNC_ACK:
		return new(wirepb.SyncAck)
	case wirepb.FrameKind_FRAME_KIND_HEARTBEAT:
		return new(wirepb.Heartbeat)
	case wirepb.FrameKind_FRAME_KIND_SNAPSHOT_READY:
		return new(wirepb.SnapshotReady)
	case wirepb.FrameKind_FRAME_KIND_EVAL_RESULT:
		return new(wirepb.EvalResult)
	case wirepb.FrameKind_FRAME_KIND_CHECKPOINT_RESULT:
		return new(wirepb.CheckpointResult)
	case wirepb.FrameKind_FRAME_KIND_SESSION_ID_GENERATED:
		return new(wirepb.SessionIdGenerated)
	case wirepb.FrameKind_FRAME_KIND_EPOCH_FN_ELAPSED:
		return new(wirepb.EpochFnElapsed)
	case wirepb.FrameKind_FRAME_KIND_RESOURCE_SAMPLE:
		return new(wirepb.ResourceSample)
	case wirepb.FrameKind_FRAME_KIND_EXITING:
		return new(wirepb.Exiting)
	case wirepb.FrameKind_FRAME_KIND_METRICS:
		return new(wirepb.Metrics)
	case wirepb.FrameKind_FRAME_KIND_MEET_REQUEST:
		return new(wirepb.MeetRequest)
	case wirepb.FrameKind_FRAME_KIND_RELAY_POST:
		return new(wirepb.RelayPost)
	case wirepb.FrameKind_FRAME_KIND_PLUGIN_RESTARTED:
		return new(wirepb.PluginRestarted)
	}
	return nil
}

// kindOf is newMessage's inverse: the kind that carries msg's type, or
// FRAME_KIND_UNSPECIFIED for any other message (nil included).
func kindOf(msg proto.Message) wirepb.FrameKind {
	switch msg.(type) {
	case *wirepb.StartEpoch:
		return wirepb.FrameKind_FRAME_KIND_START_EPOCH
	case *wirepb.Sync:
		return wirepb.FrameKind_FRAME_KIND_SYNC
	case *wirepb.Update:
		return wirepb.FrameKind_FRAME_KIND_UPDATE
	case *wirepb.Throttle:
		return wirepb.FrameKind_FRAME_KIND_THROTTLE
	case *wirepb.SetGlobalStep:
		return wirepb.FrameKind_FRAME_KIND_SET_GLOBAL_STEP
	case *wirepb.Checkpoint:
		return wirepb.FrameKind_FRAME_KIND_CHECKPOINT
	case *wirepb.Evaluate:
		return wirepb.FrameKind_FRAME_KIND_EVALUATE
	case *wirepb.ExtendPartition:
		return wirepb.FrameKind_FRAME_KIND_EXTEND_PARTITION
	case *wirepb.DeclareDead:
		return wirepb.FrameKind_FRAME_KIND_DECLARE_DEAD
	case *wirepb.RequestSessionId:
		return wirepb.FrameKind_FRAME_KIND_REQUEST_SESSION_ID
	case *wirepb.NewSession:
		return wirepb.FrameKind_FRAME_KIND_NEW_SESSION
	case *wirepb.SetEpochCallbackRole:
		return wirepb.FrameKind_FRAME_KIND_SET_EPOCH_CALLBACK_ROLE
	case *wirepb.Shutdown:
		return wirepb.FrameKind_FRAME_KIND_SHUTDOWN
	case *wirepb.ShutdownWithSave:
		return wirepb.FrameKind_FRAME_KIND_SHUTDOWN_WITH_SAVE
	case *wirepb.CoordinatorHeartbeat:
		return wirepb.FrameKind_FRAME_KIND_COORDINATOR_HEARTBEAT
	case *wirepb.Admit:
		return wirepb.FrameKind_FRAME_KIND_ADMIT
	case *wirepb.Meeting:
		return wirepb.FrameKind_FRAME_KIND_MEETING
	case *wirepb.RelayResult:
		return wirepb.FrameKind_FRAME_KIND_RELAY_RESULT
	case *wirepb.EpochEnd:
		return wirepb.FrameKind_FRAME_KIND_EPOCH_END

	case *wirepb.Ready:
		return wirepb.FrameKind_FRAME_KIND_READY
	case *wirepb.Batch:
		return wirepb.FrameKind_FRAME_KIND_BATCH
	case *wirepb.SyncAck:
		return wirepb.FrameKind_FRAME_KIND_SYNC_ACK
	case *wirepb.Heartbeat:
		return wirepb.FrameKind_FRAME_KIND_HEARTBEAT
	case *wirepb.SnapshotReady:
		return wirepb.FrameKind_FRAME_KIND_SNAPSHOT_READY
	case *wirepb.EvalResult:
		return wirepb.FrameKind_FRAME_KIND_EVAL_RESULT
	case *wirepb.CheckpointResult:
		return wirepb.FrameKind_FRAME_KIND_CHECKPOINT_RESULT
	case *wirepb.SessionIdGenerated:
		return wirepb.FrameKind_FRAME_KIND_SESSION_ID_GENERATED
	case *wirepb.EpochFnElapsed:
		return wirepb.FrameKind_FRAME_KIND_EPOCH_FN_ELAPSED
	case *wirepb.ResourceSample:
		return wirepb.FrameKind_FRAME_KIND_RESOURCE_SAMPLE
	case *wirepb.Exiting:
		return wirepb.FrameKind_FRAME_KIND_EXITING
	case *wirepb.Metrics:
		return wirepb.FrameKind_FRAME_KIND_METRICS
	case *wirepb.MeetRequest:
		return wirepb.FrameKind_FRAME_KIND_MEET_REQUEST
	case *wirepb.RelayPost:
		return wirepb.FrameKind_FRAME_KIND_RELAY_POST
	case *wirepb.PluginRestarted:
		return wirepb.FrameKind_FRAME_KIND_PLUGIN_RESTARTED
	}
	return wirepb.FrameKind_FRAME_KIND_UNSPECIFIED
}

// toRank reports whether kind flows coordinator -> rank.
func toRank(kind wirepb.FrameKind) bool { return uint32(kind) < kindRankBase }
