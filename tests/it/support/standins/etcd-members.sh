# Shared by the crictl and etcdctl stand-ins (mirror.rs pastes it where they say
# @ETCD_MEMBERS_SH@): etcdctl's member commands. The members come from
# /var/lib/kprov-standins/etcd-members when a test wrote it, one member a line:
#   DECIMAL_ID NAME PEER_URL CLIENT_URL HEALTHY   (HEALTHY: true or false)
# and otherwise this host is the one healthy member. Editing the file while kprov runs is how
# a test makes a member go unhealthy (or heal).
members_file=/var/lib/kprov-standins/etcd-members
members() {
  if [ -f "$members_file" ]; then cat "$members_file"
  else echo "1 $(hostname) https://127.0.0.1:2380 https://127.0.0.1:2379 true"; fi
}

# etcdctl_args ARGS...: sets $json (-w json), $cluster (--cluster) and $words (the
# positional words, e.g. "snapshot save FILE"), skipping the flags that take a value.
etcdctl_args() {
  json=false; cluster=false; words=""; skip=""
  for a in "$@"; do
    if [ -n "$skip" ]; then
      [ "$skip" = w ] && [ "$a" = json ] && json=true
      skip=""; continue
    fi
    case "$a" in
      --cluster|--cluster=true) cluster=true ;;
      -w|--write-out) skip=w ;;
      -w=json|--write-out=json) json=true ;;
      --endpoints|--cacert|--cert|--key|--command-timeout|--dial-timeout) skip=v ;;
      -*) ;;
      *) words="$words $a" ;;
    esac
  done
}

# etcd_members_answer WORDS...: answers member list, endpoint health (this host's member, or
# every member with --cluster) and member remove HEX; returns 2 for anything else.
etcd_members_answer() {
  case "${1:-} ${2:-}" in
  "member list")
    if $json; then
      printf '{"header":{"cluster_id":1,"member_id":1,"raft_term":2},"members":['
      sep=""
      members | while read -r mid name peer client healthy; do
        printf '%s{"ID":%s,"name":"%s","peerURLs":["%s"],"clientURLs":["%s"]}' "$sep" "$mid" "$name" "$peer" "$client"
        sep=","
      done
      printf ']}\n'
    else
      members | while read -r mid name peer client healthy; do
        printf '%x, started, %s, %s, %s, false\n' "$mid" "$name" "$peer" "$client"
      done
    fi
    return 0 ;;
  "endpoint health")
    me=$(hostname)
    answer=$(members | while read -r mid name peer client healthy; do
      if $cluster || [ "$name" = "$me" ]; then echo "$client $healthy"; fi
    done)
    [ -n "$answer" ] || answer="https://127.0.0.1:2379 false"
    if $json; then
      printf '['
      sep=""
      echo "$answer" | while read -r client healthy; do
        if [ "$healthy" = true ]; then
          printf '%s{"endpoint":"%s","health":true,"took":"1ms"}' "$sep" "$client"
        else
          printf '%s{"endpoint":"%s","health":false,"took":"5s","error":"context deadline exceeded"}' "$sep" "$client"
        fi
        sep=","
      done
      printf ']\n'
    else
      echo "$answer" | while read -r client healthy; do
        if [ "$healthy" = true ]; then
          echo "$client is healthy: successfully committed proposal: took = 1ms"
        else
          echo "$client is unhealthy: failed to commit proposal: context deadline exceeded" >&2
        fi
      done
    fi
    if echo "$answer" | grep -q ' false$'; then
      echo "Error: unhealthy cluster" >&2
      exit 1
    fi
    return 0 ;;
  "member remove")
    [ -f "$members_file" ] || { echo "stand-in: member remove needs $members_file" >&2; exit 1; }
    dec=$(printf '%d' "0x${3:-}")
    grep -q "^$dec " "$members_file" || { echo "etcdserver: member not found" >&2; exit 1; }
    grep -v "^$dec " "$members_file" > "$members_file.new" || true
    # Rewritten in place: the list may be a link to one a lab's hosts share.
    cat "$members_file.new" > "$members_file" && rm -f "$members_file.new"
    echo "$(date +%s%N) remove $dec" >> "$(readlink -f "$members_file").history"
    # A test cuts a roll right after a removal: while LIST.hold exists the answer waits
    # (at most 60 s), so the caller is killed before it acts on it.
    n=0
    while [ -f "$(readlink -f "$members_file").hold" ] && [ $n -lt 600 ]; do
      sleep 0.1; n=$((n + 1))
    done
    echo "Member ${3:-} removed from cluster 1"
    return 0 ;;
  esac
  return 2
}
