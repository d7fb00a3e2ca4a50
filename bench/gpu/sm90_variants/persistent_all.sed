# every head dim on the persistent grid
s/kPersistent = false/kPersistent = true/
