package sqlstore

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/storage/postgres"
	"github.com/keyserver/keyserver/storage/sqlite3"
)

// releasedSteps are the sha256 digests of the released migration steps:
// of the SQL each database runs for the step (stepDigest). A database that ran a step keeps what
// the step did, so a released step never changes: a change of the schema
// is a new step. A new step's digest is added here with the step
// (PRINT_MIGRATION_DIGESTS=1 makes the test print the table).
var releasedSteps = map[int]string{
	1:  "67459c60f64f98d7733dc51b9ad24028191c13aff6ad2e1960997e82fa1563f2",
	2:  "42e0205fec60e1063289a97a31f09a1fdd80386975ad9b3943092a528978cfae",
	3:  "7927ec2cea0811561a5d21ff1bdddd95fd66238e1fdab3530006238bdb83f6a8",
	4:  "ade3fb362a0074f6ad85f8764620133d1c780070a3806404bf4108111b622d34",
	5:  "04ebb3feb9d906b0fe5ba23eaae1a00609addbbd976d30f5076d4b9521f3361c",
	6:  "6c8588857335c313313083078fca9e1ed39126e3d9e645766047e8aaa3220c17",
	7:  "cb19641442cf23b045e996cbc21769893532436187379347d93d23cd6c022c20",
	8:  "574819019bfb2d1eabba21f45586a341a165cbb0e953c95fb7e6cc0770ca671e",
	9:  "421e0d79a95c53368f4c94595f5aadfb0e684ad9bc2521200d855961e16d8a54",
	10: "9cf1541fcdbba7ec753f4713602f5ff1b66a5c410ecc81eb7d6f02273137e076",
	11: "38aebbb75ac9442b402e0c4d53c9572e820c58d4b5487cf4642461e239348c30",
	12: "7730fa50dc09f5b20f802442ce8ad71f8f4cd4e463fa81a3b96c79ab9a05697a",
	13: "29c6ce3319ab50b95fbf260b9b0b25b5b338eee830aa598224e614b3ac2a92f8",
	14: "42dcc0ca7851a1f8d0284e546974aa47687bef9a3959ed449c04bed08f6986c9",
	15: "00180ba3d1661864acb6c7c0e56d04654f899c075fdaf65b8c414ebf28eba382",
	16: "d08497fb2ee5000e47bcfa9475ae550acc697198680776deece00467f343d83a",
	17: "7deb1d4758db2acbb97fe1a51f592d04ce1c4fd0acb6dfc2d95b5c418b55e199",
	18: "350ee1e98a2b76ed23a7dd23e2957a563834bee1a2675f75126405bd2c638eb4",
	19: "140a2b33862cad3843551600fed04c7aa3b0cb206684c4b458bd5c98d1c0930a",
	20: "682cd4624ee439ee40f6d4247dac405e1b69b0367154e3543ecfd38ced1e12cb",
	21: "06ebca2a3cbe2780afc78bc969960df207ec671737ff623986787dbd6cb86183",
	22: "e95c545729505fb3f37c1a899c5b4b9b0994ea1a56af7e3c2a7494c153d8757e",
	23: "f9422663cdc6bcdcb58763c1e963bd4fe6ad4cf6a5e89b13f8be35f040a89b18",
	24: "8e17ea8afe9279907f39d79a1ba053d541524549db08900bc236c860a2a01e83",
	25: "66c8c995b94984926ac8801fcc4d0210ada6412f6c0315b04c477d7908a00d46",
	26: "becc29cf7f00ce32edf3203b1878f73d801b3d3909b2d1b0fce7ad6c169395dc",
	27: "a9bec5f5982281055aa9aa486e0082ccc4b6d1ba62e2cb01abce55c488b086ea",
	28: "1f1b73689ed722d9302a3db3729d5cb83438250cf0cd5db09e529c03deae7e2b",
	29: "ebaa3d9cdfbd5bfed87080a0991c985c4b0dc3ad698c1fa646b6b1613e167ae5",
	31: "196ef8d2728f7f870fb65d7565f69ef4f5784bfddf1c0f00ea48acf35002aa69",
}

// stepDigest is the digest of step m as releasedSteps keeps it: of the
// SQL each database runs for it, its placeholders filled.
func stepDigest(m migration) string {
	h := sha256.New()
	for _, d := range []struct {
		name   string
		schema map[string]string
	}{{"sqlite3", sqlite3.Schema}, {"postgres", postgres.Schema}} {
		ddl := m.sql
		for k, r := range d.schema {
			ddl = strings.ReplaceAll(ddl, k, r)
		}
		h.Write([]byte(d.name + "\x00" + ddl + "\x00"))
	}
	for _, st := range postgresSteps[m.version] {
		h.Write([]byte(st + "\x00"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// No released migration step changes, and each has its digest.
func TestReleasedMigrationStepsAreFrozen(t *testing.T) {
	var table strings.Builder
	for _, m := range migrations {
		d := stepDigest(m)
		table.WriteString("\t" + strconv.Itoa(m.version) + ": \"" + d + "\",\n")
		want, ok := releasedSteps[m.version]
		if !ok {
			t.Errorf("migration %d (%s) has no digest in releasedSteps: add %q once it is released", m.version, m.name, d)
			continue
		}
		if want != d {
			t.Errorf("migration %d (%s) changed since it was released (digest %s, released %s): "+
				"a database that ran it keeps what it did, so put the change in a new step", m.version, m.name, d, want)
		}
	}
	for v := range releasedSteps {
		if !hasStep(v) {
			t.Errorf("released migration %d is gone", v)
		}
	}
	if os.Getenv("PRINT_MIGRATION_DIGESTS") != "" {
		t.Log("\n" + table.String())
	}
}

func hasStep(v int) bool {
	for _, m := range migrations {
		if m.version == v {
			return true
		}
	}
	return false
}
