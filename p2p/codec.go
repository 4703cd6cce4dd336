package p2p

import (
	"fmt"

	"github.com/deepmarket/deepmarket/wire"
)

// Marshal encodes v with DeepMarket's deterministic encoding.
func Marshal(v any) ([]byte, error) { return wire.Marshal(v) }

// Unmarshal decodes data into v; failures wrap ErrMalformed.
func Unmarshal(data []byte, v any) error {
	if err := wire.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}
