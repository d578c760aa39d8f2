// Package realpods tests ctrlmesh's components as they run in a user's
// clusters: in pods on real nodes (test/controlplane Spec.Node), from
// images built by test/images, installed by their Helm charts with the real
// helm. Its tests need root, 'make node-packages' and 'make tools'.
package realpods
