"""imgcopy's test suite: a package, so that its helpers import one another
relatively and the checkout's imgcopy (built in place) is the one tested."""
