//go:build !amd64

package main

import "errors"

func cloneFiller() (int, error) { return 0, errors.New("clone fillers need amd64") }

const haveCloneFiller = false
