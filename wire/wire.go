package wire

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"

	"github.com/fxamacker/cbor/v2"
)

// ErrMalformed wraps every decoding failure.
var ErrMalformed = errors.New("malformed encoding")

// ErrNotCanonical is wrapped (with ErrMalformed) when the bytes decode but
// are not the one encoding Marshal gives the value: unknown or duplicate
// keys, keys out of order, non-minimal integers or lengths, trailing bytes,
// fields present with their zero value where they are omitted. A signature
// covers exact bytes, so a message must have exactly one form, or a third
// party could change its bytes (and its hash) without the signer's key.
var ErrNotCanonical = errors.New("not the canonical encoding")

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	if encMode, err = cbor.CoreDetEncOptions().EncMode(); err != nil {
		panic(err)
	}
	decMode, err = cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		UTF8:              cbor.UTF8RejectInvalid,
		MaxNestedLevels:   8,
		MaxArrayElements:  1024,
		MaxMapPairs:       64,
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

// Unmarshal decodes data into v with the decoding limits and accepts only
// the canonical encoding: after decoding, v is encoded again and must give
// back data byte for byte. So every accepted message has one form and one
// hash.
func Unmarshal(data []byte, v any) error {
	if err := decMode.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	// v is a pointer; encode what it points to, as Marshal would have.
	again, err := encMode.Marshal(reflect.ValueOf(v).Elem().Interface())
	if err != nil {
		return fmt.Errorf("%w: re-encode: %v", ErrMalformed, err)
	}
	if !bytes.Equal(again, data) {
		return fmt.Errorf("%w: %w", ErrMalformed, ErrNotCanonical)
	}
	return nil
}
