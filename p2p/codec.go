package p2p

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// DeepMarket encodes every signed message with CBOR core deterministic
// encoding (RFC 8949 §4.2.1): the same value always gives the same bytes, so
// a signature covers exactly one encoding.
var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	if encMode, err = cbor.CoreDetEncOptions().EncMode(); err != nil {
		panic(err)
	}
	// Limits keep a hostile message from making the decoder allocate much.
	decMode, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  8,
		MaxArrayElements: 256,
		MaxMapPairs:      64,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// Marshal encodes v deterministically.
func Marshal(v any) ([]byte, error) {
	b, err := encMode.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}

// Unmarshal decodes CBOR data into v with DeepMarket's decoding limits.
func Unmarshal(data []byte, v any) error {
	if err := decMode.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}
