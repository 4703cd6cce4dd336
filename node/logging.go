package node

import (
	"context"
	"io"
	"log/slog"
	"sync"

	golog "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/gologshim"
	"go.uber.org/zap/zapcore"
)

// ParseLevel maps a config level name to slog's.
func ParseLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// NewLogger builds the node's one logger.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: ParseLevel(level)}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var routeOnce sync.Once

// RouteLibp2pLogs sends go-libp2p's logs (slog, through gologshim) and the
// go-log/zap logs of the DHT and friends into log, tagged module=libp2p,
// at level and above. Both are process-wide, so the first node of a
// process sets them.
func RouteLibp2pLogs(log *slog.Logger, level string) {
	routeOnce.Do(func() {
		h := &levelHandler{min: ParseLevel(level), h: log.Handler().WithAttrs([]slog.Attr{slog.String("module", "libp2p")})}
		gologshim.SetDefaultHandler(h)
		golog.SetPrimaryCore(&zapToSlog{h: h})
		if lv, err := golog.LevelFromString(level); err == nil {
			golog.SetAllLoggers(lv)
		}
	})
}

// levelHandler filters records below min before the wrapped handler.
type levelHandler struct {
	min slog.Level
	h   slog.Handler
}

func (l *levelHandler) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.min && l.h.Enabled(ctx, lv)
}
func (l *levelHandler) Handle(ctx context.Context, r slog.Record) error { return l.h.Handle(ctx, r) }
func (l *levelHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return &levelHandler{min: l.min, h: l.h.WithAttrs(a)}
}
func (l *levelHandler) WithGroup(g string) slog.Handler {
	return &levelHandler{min: l.min, h: l.h.WithGroup(g)}
}

// zapToSlog is a zapcore.Core writing into a slog.Handler.
type zapToSlog struct {
	h      slog.Handler
	fields []zapcore.Field
}

func zapLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (z *zapToSlog) Enabled(l zapcore.Level) bool {
	return z.h.Enabled(context.Background(), zapLevel(l))
}

func (z *zapToSlog) With(fields []zapcore.Field) zapcore.Core {
	return &zapToSlog{h: z.h, fields: append(append([]zapcore.Field(nil), z.fields...), fields...)}
}

func (z *zapToSlog) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if z.Enabled(e.Level) {
		return ce.AddCore(e, z)
	}
	return ce
}

func (z *zapToSlog) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), z.fields...), fields...) {
		f.AddTo(enc)
	}
	r := slog.NewRecord(e.Time, zapLevel(e.Level), e.Message, 0)
	r.AddAttrs(slog.String("logger", e.LoggerName))
	for k, v := range enc.Fields {
		r.AddAttrs(slog.Any(k, v))
	}
	return z.h.Handle(context.Background(), r)
}

func (z *zapToSlog) Sync() error { return nil }
