package node

import (
	"bytes"
	"io"
	"text/template"

	"github.com/BurntSushi/toml"
)

// renderTemplate fills a config template; {{lit .X}} writes X as a TOML
// literal so quoting is always right.
func renderTemplate(w io.Writer, text string, data any) error {
	tmpl, err := template.New("config").Funcs(template.FuncMap{"lit": tomlLiteral}).Option("missingkey=error").Parse(text)
	if err != nil {
		return err
	}
	return tmpl.Execute(w, data)
}

// tomlLiteral encodes one value as it would appear right of "key = ".
func tomlLiteral(v any) (string, error) {
	if l, ok := v.([]string); ok && len(l) == 0 {
		return "[]", nil // the encoder writes nothing for an empty list
	}
	if l, ok := v.([]int); ok && len(l) == 0 {
		return "[]", nil
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(map[string]any{"k": v}); err != nil {
		return "", err
	}
	out := bytes.TrimSpace(buf.Bytes())
	return string(bytes.TrimSpace(bytes.TrimPrefix(out, []byte("k =")))), nil
}
