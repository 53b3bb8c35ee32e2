package roomserver

import "testing"

// Event contents must be JSON objects; anything else is refused.
func TestIsObject(t *testing.T) {
	for raw, want := range map[string]bool{
		`{}`:                    true,
		` {"a":[1,{"b":null}]}`: true,
		"\n\t{\"x\":1}\r\n":     true,
		``:                      false,
		`null`:                  false,
		`[]`:                    false,
		`"{}"`:                  false,
		`1`:                     false,
		`{"a":1`:                false,
		`{"a":1}}`:              false,
		`{"a":1} {}`:            false,
		`{a:1}`:                 false,
	} {
		if got := isObject([]byte(raw)); got != want {
			t.Errorf("isObject(%q) = %v, want %v", raw, got, want)
		}
	}
}
