package logging

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// GRPC is a grpclog.LoggerV2 writing gRPC's own lines through l, in the
// binary's format (its default wrote them to stderr in Go's log format,
// one line of plain text among the JSON). It keeps gRPC's default of what
// is shown: its errors at error, its info and warnings at debug (gRPC
// shows them only when GRPC_GO_LOG_SEVERITY_LEVEL asks). Set it with
// grpclog.SetLoggerV2 before any gRPC call.
func GRPC(l *slog.Logger) grpclog.LoggerV2 { return grpcLogger{l} }

type grpcLogger struct{ l *slog.Logger }

// line is args as fmt.Sprintln has them, without its newline.
func line(args []any) string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }

func (g grpcLogger) Info(args ...any)                    { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)                  { g.l.Debug(line(args)) }
func (g grpcLogger) Infof(format string, args ...any)    { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)                 { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.l.Debug(line(args)) }
func (g grpcLogger) Warningf(format string, args ...any) { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Error(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)                 { g.l.Error(line(args)) }
func (g grpcLogger) Errorf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }

// Fatal, Fatalln and Fatalf log at error and exit, as gRPC's own do.
func (g grpcLogger) Fatal(args ...any)   { g.l.Error(fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) { g.l.Error(line(args)); os.Exit(1) }
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.l.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V says whether gRPC's verbose lines are shown: at debug.
func (g grpcLogger) V(int) bool { return g.l.Enabled(context.Background(), slog.LevelDebug) }
