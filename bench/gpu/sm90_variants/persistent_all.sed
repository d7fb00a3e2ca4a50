# every head dim on the persistent grid at every length
s/kPersistentKeys[^;]*;/kPersistentKeys = kAlwaysPersistent;/
