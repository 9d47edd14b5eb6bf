package plugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// How errors cross the plugin boundary.
//
// In the plugin, an error from the implementation travels as gRPC status
// Unknown with the error's text as its message; context errors travel as
// Canceled / DeadlineExceeded; a request the adapter cannot convert is
// InvalidArgument. On the host, the client adapter turns a failed call back
// into an error that reads "<Service>.<Method>: <plugin's message>", keeps
// the status (status.Code works on it), and wraps the caller's context
// error when that context is what ended the call, so errors.Is(err,
// context.Canceled) holds.

// ErrRoundAborted is wrapped by an averager's error for a round that ended
// without a result for a reason the cohort recovers from (a peer died,
// Abort was called, the backend failed the round for everyone): the rank
// reports the round aborted and waits for the coordinator to re-form the
// group, instead of exiting. It crosses the plugin boundary as gRPC status
// Aborted, and errors.Is finds it on the host.
var ErrRoundAborted = errors.New("averaging round aborted")

// statusError is what a server adapter returns for an implementation error.
func statusError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrRoundAborted):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// invalidRequest is what a server adapter returns for a request it cannot
// convert to domain values.
func invalidRequest(method string, err error) error {
	return status.Errorf(codes.InvalidArgument, "invalid %s request: %v", method, err)
}

// invalidResponse is the host-side error for a reply the client adapter
// cannot convert to domain values.
func invalidResponse(op string, err error) error {
	return fmt.Errorf("%s: plugin sent an invalid reply: %w", op, err)
}

// callError is the host-side error for a failed call.
func callError(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", op, ctxErr)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	return &remoteError{op: op, st: st}
}

// remoteError is an error reported by the plugin or by the connection to it.
type remoteError struct {
	op string
	st *status.Status
}

func (e *remoteError) Error() string {
	switch e.st.Code() {
	case codes.Unknown, codes.Aborted:
		// The implementation's own error: its text, as the plugin wrote it.
		return e.op + ": " + e.st.Message()
	case codes.Unimplemented:
		return e.op + ": not served by this plugin (wrong plugin kind or protocol version): " + e.st.Message()
	}
	return fmt.Sprintf("%s: %s (%v)", e.op, e.st.Message(), e.st.Code())
}

// Is lets errors.Is see an aborted round through the boundary.
func (e *remoteError) Is(target error) bool {
	return target == ErrRoundAborted && e.st.Code() == codes.Aborted
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *remoteError) GRPCStatus() *status.Status { return e.st }
