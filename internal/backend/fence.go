//go:build !gormlease_mutate_fence

package backend

// fenceWhere is the condition by which the fenced commit's statements (Save,
// SaveRelease) find the caller's own row: ownWhere. A build with the tag
// gormlease_mutate_fence breaks it on purpose (fence_mutated.go).
const fenceWhere = ownWhere
