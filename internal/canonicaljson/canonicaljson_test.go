package canonicaljson

import "testing"

func TestWithoutUnsigned(t *testing.T) {
	got, err := WithoutUnsigned([]byte(`{ "b": [1, 2], "unsigned": {"x": 1}, "a": "\u00e9" }`))
	if err != nil || string(got) != `{"a":"é","b":[1,2]}` {
		t.Fatalf("%s %v", got, err)
	}
	if _, err := WithoutUnsigned([]byte(`[1]`)); err == nil {
		t.Fatal("a list is not an object")
	}
}
