package proxy

// NewDiscoveryMapper is newDiscoveryMapper, for the tests against a real
// API server (package proxy_test).
var NewDiscoveryMapper = newDiscoveryMapper
