//go:build !amd64 && !arm64

package bindtrap

// auditArch 0 matches no architecture: the filter allows every call.
// Supported refuses such a build (archSupported).
const auditArch = 0
