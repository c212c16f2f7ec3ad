"""`prewarm doctor`: the checks (`checks`), who the functions are in the cluster and what they need
there (`identities`), and the run that orders them (`run`)."""
