// Package redirect programs the netfilter rules of Iptables interception in
// a pod's network namespace: connections to the API server's addresses are
// redirected to the proxy on loopback, except the proxy's own (by the user
// ID it runs as). It runs once, in the init container the injector adds
// (ctrlmesh-proxy redirect, with the NET_ADMIN capability only), before the
// proxy and the operator start; every error fails it, and the kubelet then
// starts neither: a pod whose operator would reach the API server around
// the proxy does not run.
//
// The rules are nftables (the kernel's netfilter through netlink, which
// iptables-nft writes too), in a table of their own that is replaced whole
// when the init container runs again:
//
//	table ip ctrlmesh-redirect {
//		chain output {
//			type nat hook output priority dstnat
//			meta skuid <proxy uid> return
//			meta l4proto tcp ip daddr <address> tcp dport <port> dnat to 127.0.0.1:<proxy port>
//			...
//		}
//	}
package redirect

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table the rules live in.
const TableName = "ctrlmesh-redirect"

// chainName is the chain of the table, hooked to locally made packets.
const chainName = "output"

// Options of the redirection.
type Options struct {
	// Destinations are the API server's addresses the operator may dial:
	// the kubernetes Service's ClusterIP and port, and its endpoints.
	Destinations []netip.AddrPort
	// ToPort is the proxy's port on 127.0.0.1.
	ToPort uint16
	// ExcludeUserID is the user the proxy runs as, whose connections go
	// where they were sent.
	ExcludeUserID uint32
}

// ParseDestination parses "host:port" with an IPv4 address, as the
// injector writes it from the kubelet's $(KUBERNETES_SERVICE_HOST) and
// $(KUBERNETES_SERVICE_PORT). A host name is refused: the rules match
// addresses. IPv6 is refused too: the proxy listens on 127.0.0.1.
func ParseDestination(s string) (netip.AddrPort, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("destination %q: want address:port", s)
	}
	host, portText := strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]"), s[i+1:]
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("destination %q: %q is not an IP address (is $(KUBERNETES_SERVICE_HOST) set?)", s, host)
	}
	if !addr.Is4() || addr.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("destination %q: only IPv4 API server addresses can be redirected (the proxy listens on 127.0.0.1); use Environment interception", s)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return netip.AddrPort{}, fmt.Errorf("destination %q: %q is not a port (is $(KUBERNETES_SERVICE_PORT) set?)", s, portText)
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// Validate checks opts before any rule is written.
func (o Options) Validate() error {
	if len(o.Destinations) == 0 {
		return errors.New("no destination to redirect: the API server's address is needed")
	}
	for _, d := range o.Destinations {
		if !d.IsValid() || !d.Addr().Is4() || d.Port() == 0 {
			return fmt.Errorf("destination %v cannot be redirected: want an IPv4 address and a port", d)
		}
		if d.Addr().IsLoopback() {
			return fmt.Errorf("destination %v is on loopback, where the proxy listens", d)
		}
	}
	if o.ToPort == 0 {
		return errors.New("the proxy's port is needed")
	}
	if o.ExcludeUserID == 0 {
		return errors.New("the proxy's user ID must not be root's: every root process of the pod would pass around the proxy")
	}
	return nil
}

// Apply replaces the table's rules in the network namespace of conn with
// those of opts, in one netlink transaction, and reads them back: an error
// means the redirection may not be in force.
func Apply(conn *nftables.Conn, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	existing, err := conn.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("listing the netfilter tables (does the container have the NET_ADMIN capability?): %w", err)
	}
	if slices.ContainsFunc(existing, func(t *nftables.Table) bool { return t.Name == TableName }) {
		conn.DelTable(table)
	}
	conn.AddTable(table)
	chain := conn.AddChain(&nftables.Chain{
		Name: chainName, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest,
	})
	want := Rules(opts)
	for _, exprs := range want {
		conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: exprs})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("writing the netfilter rules (does the container have the NET_ADMIN capability?): %w", err)
	}
	got, err := conn.GetRules(table, chain)
	if err != nil {
		return fmt.Errorf("reading the netfilter rules back: %w", err)
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d netfilter rules in force, want %d", len(got), len(want))
	}
	return nil
}

// Rules are the expressions of the chain's rules: the proxy's user returns
// first, then one DNAT per destination.
func Rules(opts Options) [][]expr.Any {
	rules := [][]expr.Any{{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(opts.ExcludeUserID)},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}}
	loopback := netip.AddrFrom4([4]byte{127, 0, 0, 1}).AsSlice()
	for _, d := range opts.Destinations {
		rules = append(rules, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			// IPv4 destination address: bytes 16-19 of the header.
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: d.Addr().AsSlice()},
			// TCP destination port: bytes 2-3.
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(d.Port())},
			&expr.Immediate{Register: 1, Data: bytes.Clone(loopback)},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(opts.ToPort)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		})
	}
	return rules
}
