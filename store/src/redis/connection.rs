//! The one connection type the Redis store sends through: a single server
//! or a Redis Cluster, and the URLs that name each.
//!
//! The store's key layout is the same for both (every script keeps to one
//! slot), so nothing above this module knows which one it talks to.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

use crate::StoreError;

/// The scheme of a cluster URL:
/// `redis+cluster://[user:password@]host:port,host:port,.../`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// A connection to a single server, reconnecting on its own, or to a
/// cluster, routing each command to the node serving its key's slot.
///
/// Cloning is cheap: clones share the underlying connections.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Single(connection) => f.debug_tuple("Single").field(connection).finish(),
            // The cluster connection keeps no state worth printing here.
            Self::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

impl Connection {
    /// Connects to what `url` names: a cluster for a URL
    /// [`cluster_nodes`] reads, a single server for any other URL the redis
    /// crate accepts.
    pub(super) async fn open(url: &str) -> Result<Self, StoreError> {
        match cluster_nodes(url)? {
            Some(nodes) => Self::cluster(&nodes).await,
            None => Ok(Self::Single(
                ConnectionManager::new(Client::open(url)?).await?,
            )),
        }
    }

    /// Connects to the cluster that `nodes` (`redis://host:port/` URLs, one
    /// or more of its nodes) belong to.
    pub(super) async fn cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Self, StoreError> {
        if nodes.is_empty() {
            return Err(StoreError::Invalid(
                "a redis cluster needs at least one node URL".to_owned(),
            ));
        }
        let nodes: Vec<&str> = nodes.iter().map(|node| node.as_ref()).collect();
        let client = ClusterClient::new(nodes)?;
        Ok(Self::Cluster(client.get_async_connection().await?))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

/// The node URLs of a URL that names a cluster, `None` for a URL of a
/// single server.
///
/// A cluster is named by a [`CLUSTER_SCHEME`] URL with one or more hosts, or
/// by a `redis://` URL with several (`redis://h1:7000,h2:7000/`), which no
/// single server's URL can be: the second form is what `websubd --store`
/// takes, since its settings accept `redis://` URLs. Credentials before `@`
/// apply to every node. A cluster has only database 0, so anything after
/// the hosts other than `/` is refused rather than ignored.
pub(super) fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>, StoreError> {
    let (rest, explicit) = match url.strip_prefix(CLUSTER_SCHEME) {
        Some(rest) => (rest, true),
        None => match url.strip_prefix("redis://") {
            Some(rest) => (rest, false),
            None => return Ok(None),
        },
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), authority),
    };
    if !explicit && !hosts.contains(',') {
        return Ok(None);
    }
    let invalid = |why: &str| StoreError::Invalid(format!("redis cluster URL {url:?}: {why}"));
    let after = &rest[authority.len()..];
    if !after.is_empty() && after != "/" {
        return Err(invalid("a cluster has no database or options to select"));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                Err(invalid("an empty host"))
            } else {
                Ok(format!("redis://{credentials}{host}/"))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_node() {
        for single in [
            "redis://127.0.0.1:6379/",
            "redis://user:a,b@127.0.0.1:6379/2",
            "rediss://h:1,h:2/",
        ] {
            assert_eq!(cluster_nodes(single).ok(), Some(None), "{single}");
        }
        let two = Some(Some(vec![
            "redis://127.0.0.1:7000/".to_owned(),
            "redis://127.0.0.1:7001/".to_owned(),
        ]));
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/").ok(),
            two
        );
        assert_eq!(
            cluster_nodes("redis://127.0.0.1:7000,127.0.0.1:7001").ok(),
            two
        );
        assert_eq!(
            cluster_nodes("redis+cluster://h:1").ok(),
            Some(Some(vec!["redis://h:1/".to_owned()]))
        );
        assert_eq!(
            cluster_nodes("redis+cluster://user:pw@h1:1,h2:2").ok(),
            Some(Some(vec![
                "redis://user:pw@h1:1/".to_owned(),
                "redis://user:pw@h2:2/".to_owned(),
            ]))
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://h:1,,h:2/",
            "redis+cluster://h:1,h:2/3",
            "redis://h:1,h:2/?protocol=resp3",
        ] {
            assert!(
                matches!(cluster_nodes(bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
