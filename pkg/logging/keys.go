package logging

// Keys of structured log attributes, defined once so that every component
// logs the same thing under the same name.
const (
	KeyErr         = "err"
	KeyPod         = "pod"        // namespace/name
	KeyNode        = "node"       // the node an agent or stream speaks for
	KeyPodNode     = "podNode"    // the node the API places a pod on
	KeyWorkload    = "workload"   // Kind namespace/name
	KeyReason      = "reason"     // why something failed or was rejected
	KeyAggregator  = "aggregator" // an aggregator's ingest address
	KeyAgent       = "agent"      // an agent's version
	KeyVersion     = "version"
	KeyAddr        = "addr"
	KeyPort        = "port"   // which of a process's ports
	KeyIngest      = "ingest" // listener addresses
	KeyScaler      = "scaler"
	KeyHTTP        = "http"
	KeySocket      = "socket"
	KeySecret      = "secret" // namespace/name
	KeyName        = "name"
	KeySelector    = "selector"
	KeyTargets     = "targets"
	KeyIDs         = "ids"
	KeyFile        = "file"
	KeyCert        = "cert"
	KeyClientCA    = "clientCA"
	KeyDriver      = "driver"
	KeyAudience    = "audience"
	KeyUntil       = "until"      // when something ends (a token's expiry)
	KeySampleTime  = "sampleTime" // a sample's time, as its agent gave it
	KeyNow         = "now"        // this process's clock
	KeyAccounts    = "serviceAccounts"
	KeyTriggerAuth = "triggerAuthentication"
	KeyDaemonSet   = "daemonset"
	KeyAgents      = "agents"
	KeyExpected    = "expectedAgents"
	KeyElapsed     = "elapsed"
	KeyDown        = "down"      // how long something has been unreachable
	KeyAttempts    = "attempts"  // failed attempts since it was last reached
	KeyKind        = "kind"      // a kind of workload
	KeyComponent   = "component" // a part of a binary with its own log lines
	KeyMessage     = "message"
	KeyLease       = "lease"    // namespace/name
	KeyIdentity    = "identity" // a replica's leader-election identity
	KeyLeader      = "leader"   // the identity holding a lease
	KeyMaxPods     = "maxPods"
	KeyStreams     = "streams"    // agent streams open
	KeyLeftOut     = "leftOut"    // entries left out past a bound
	KeyNeedBytes   = "needBytes"  // an estimate of memory needed
	KeyLimitBytes  = "limitBytes" // a memory limit
	KeyPercent     = "percent"    // Go's GC percent
	KeyWhat        = "what"
	KeyRetryIn     = "retryIn" // how long until the next try
	KeyNamespace   = "namespace"
	KeyNamespaces  = "namespaces"  // how many namespaces
	KeyConns       = "connections" // connections held
)
