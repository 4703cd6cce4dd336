package envbuild

import (
	"archive/tar"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/zstd"
)

// layerFile is a layer being written to a file as a zstd-compressed tar
// in one pass (go-containerregistry would compress it twice: once for
// its digest, once more to write it).
type layerFile struct {
	path string
	f    *os.File
	zw   *zstd.Encoder
	*tar.Writer
}

func newLayerFile(path string) (*layerFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		f.Close()
		return nil, err
	}
	return &layerFile{path: path, f: f, zw: zw, Writer: tar.NewWriter(zw)}, nil
}

// layer closes the file and reads it as a layer: its digest is the
// file's, its diff ID the tar's.
func (l *layerFile) layer() (v1.Layer, error) {
	if err := l.Writer.Close(); err != nil {
		l.abort()
		return nil, err
	}
	if err := l.zw.Close(); err != nil {
		l.f.Close()
		return nil, err
	}
	if err := l.f.Close(); err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(l.path)
}

// abort closes the file, if the layer is not to be read.
func (l *layerFile) abort() {
	l.zw.Close()
	l.f.Close()
}
