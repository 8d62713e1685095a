// Package pathwalk opens directories for root without ever waiting on a
// user's file system server. A path is walked one component at a time,
// each opened O_PATH relative to the one before and judged by its mount
// (Guard) before anything in it is looked up; symlinks are followed or
// refused as the caller asks, and a container's paths stay inside its
// root.
package pathwalk
