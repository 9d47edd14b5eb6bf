package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxSettingProblems bounds what one CheckSettings answer may list: a
// config block has a handful of keys, and a plugin that answers more is
// refused rather than believed.
const MaxSettingProblems = 1024

// serveCheckSettings answers CheckSettings for impl, a Trainer or an
// Averager: UNIMPLEMENTED when it has no SettingsChecker, so the host
// knows the settings went unchecked.
func serveCheckSettings(ctx context.Context, impl any, req *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error) {
	c, ok := impl.(SettingsChecker)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this plugin checks its settings only in Configure")
	}
	problems, err := c.CheckSettings(ctx, json.RawMessage(req.GetSettingsJson()))
	if err != nil {
		return nil, statusError(err)
	}
	resp := &pb.CheckSettingsResponse{}
	for _, p := range problems {
		resp.Problems = append(resp.Problems, &pb.SettingProblem{Key: p.Key, Message: p.Message})
	}
	return resp, nil
}

// callCheckSettings asks a plugin to check settings through call; a plugin
// built before CheckSettings existed answers nothing, and nil.
func callCheckSettings(ctx context.Context, op string, settings json.RawMessage,
	call func(context.Context, *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error)) ([]SettingProblem, error) {
	resp, err := call(ctx, &pb.CheckSettingsRequest{SettingsJson: settings})
	if status.Code(err) == codes.Unimplemented {
		return nil, nil
	}
	if err != nil {
		return nil, callError(ctx, op, err)
	}
	if n := len(resp.GetProblems()); n > MaxSettingProblems {
		return nil, invalidResponse(op, fmt.Errorf("%d setting problems, at most %d", n, MaxSettingProblems))
	}
	out := make([]SettingProblem, 0, len(resp.GetProblems()))
	for _, p := range resp.GetProblems() {
		out = append(out, SettingProblem{Key: p.GetKey(), Message: p.GetMessage()})
	}
	return out, nil
}

func (s *trainerServer) CheckSettings(ctx context.Context, req *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error) {
	return serveCheckSettings(ctx, s.impl, req)
}

func (s *averagerServer) CheckSettings(ctx context.Context, req *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error) {
	return serveCheckSettings(ctx, s.impl, req)
}

// CheckSettings asks the trainer plugin to check settings.
func (c *trainerClient) CheckSettings(ctx context.Context, settings json.RawMessage) ([]SettingProblem, error) {
	return callCheckSettings(ctx, "Trainer.CheckSettings", settings, func(ctx context.Context, req *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error) {
		return c.rpc.CheckSettings(ctx, req)
	})
}

// CheckSettings asks the averaging plugin to check settings.
func (c *averagerClient) CheckSettings(ctx context.Context, settings json.RawMessage) ([]SettingProblem, error) {
	return callCheckSettings(ctx, "Averager.CheckSettings", settings, func(ctx context.Context, req *pb.CheckSettingsRequest) (*pb.CheckSettingsResponse, error) {
		return c.rpc.CheckSettings(ctx, req)
	})
}

var (
	_ SettingsChecker = (*trainerClient)(nil)
	_ SettingsChecker = (*averagerClient)(nil)
)

// ProblemOf is the SettingProblem of err, a settings check's refusal whose
// message, past any "...settings: " prefix, starts with the key at fault
// ("wire = \"fp8\": want \"f32\" or \"bf16\""), as the SDK's plugins word
// them: for a plugin whose checks stop at the first refusal. The key is
// taken only when settings names it (SchemaOf's keys); else the problem
// is the block's.
func ProblemOf(err error, settings []SettingSpec) SettingProblem {
	msg := err.Error()
	if i := strings.LastIndex(msg, "settings: "); i >= 0 {
		msg = msg[i+len("settings: "):]
	}
	for _, s := range settings {
		if rest, ok := strings.CutPrefix(msg, s.Key); ok && (rest == "" || strings.ContainsRune(" =:[", rune(rest[0]))) {
			return SettingProblem{Key: s.Key, Message: msg}
		}
	}
	return SettingProblem{Message: msg}
}
