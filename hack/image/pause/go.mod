module tailguard.dev/hack/image/pause

go 1.26
