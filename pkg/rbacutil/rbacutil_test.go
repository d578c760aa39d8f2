package rbacutil_test

import (
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ctrlmesh/ctrlmesh/pkg/rbacutil"
)

func TestMerge(t *testing.T) {
	pods := func(verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: verbs}
	}
	named := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"a"}, Verbs: []string{"delete"}}
	got := rbacutil.Merge([]rbacv1.PolicyRule{pods("get", "list"), named}, []rbacv1.PolicyRule{pods("list", "watch")})
	want := []rbacv1.PolicyRule{pods("get", "list", "watch"), named}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Merge = %+v, want %+v", got, want)
	}
}

func TestRender(t *testing.T) {
	out, err := rbacutil.Render("# header\n", []client.Object{
		&rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: metav1.ObjectMeta{Name: "r"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "# header\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n") {
		t.Errorf("rendered %q", out)
	}
}
