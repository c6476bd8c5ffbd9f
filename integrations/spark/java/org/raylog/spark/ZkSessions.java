package org.raylog.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

/**
 * The ZooKeeper sessions of one JVM, shared by every {@link Zk} of the same
 * connect string: a driver that plans read after read by name (and the
 * readers that look a moved partition up) reuses one session instead of
 * opening and closing one per read (a handshake, and an expiry for the
 * server, each time).
 *
 * <p>Bounds: a session no {@link Zk} holds is closed after {@link #IDLE_MS}
 * (checked every {@link #IDLE_MS}/2 by one daemon thread); a session that
 * expired or was closed is never handed out again (the next open starts a
 * new one); all sessions close when the JVM shuts down. Opening waits at
 * most its {@code timeoutMs} for the session, outside the cache's lock.
 *
 * <p>Thread-safe (one lock over the cache; the ZooKeeper client is).
 */
final class ZkSessions {

  /** how long an unused session stays open */
  static final long IDLE_MS = 60_000;

  /** A shared ZooKeeper session and who holds it. Guarded by the class lock. */
  static final class Session {
    final ZooKeeper zk;
    final String connect;
    int holders;
    long idleSince;

    private Session(ZooKeeper zk, String connect) {
      this.zk = zk;
      this.connect = connect;
    }
  }

  private static final Map<String, Session> OPEN = new HashMap<>();
  private static ScheduledExecutorService reaper;

  private ZkSessions() {}

  /** A session with {@code connect}, shared when one is open and alive; release it with {@link #release}. */
  static Session acquire(String connect, int timeoutMs) {
    synchronized (ZkSessions.class) {
      Session s = OPEN.get(connect);
      if (s != null && s.zk.getState().isAlive()) {
        s.holders++;
        return s;
      }
    }
    Session fresh = new Session(connect(connect, timeoutMs), connect);
    List<Session> stale = new ArrayList<>();
    Session chosen;
    synchronized (ZkSessions.class) {
      Session s = OPEN.get(connect);
      if (s != null && s.zk.getState().isAlive()) {
        stale.add(fresh); // another thread opened one meanwhile
        chosen = s;
      } else {
        if (s != null && s.holders == 0) {
          stale.add(s);
        }
        OPEN.put(connect, fresh);
        chosen = fresh;
        startReaper();
      }
      chosen.holders++;
    }
    closeAll(stale);
    return chosen;
  }

  /** Give back a session of {@link #acquire}; an unused one closes after {@link #IDLE_MS}, a dead one at once. */
  static void release(Session s) {
    boolean close;
    synchronized (ZkSessions.class) {
      s.holders--;
      s.idleSince = System.currentTimeMillis();
      close = s.holders == 0 && (OPEN.get(s.connect) != s || !s.zk.getState().isAlive());
      if (close && OPEN.get(s.connect) == s) {
        OPEN.remove(s.connect);
      }
    }
    if (close) {
      closeAll(List.of(s));
    }
  }

  /** The ids of the sessions open now. */
  static synchronized long[] sessionIds() {
    return OPEN.values().stream().mapToLong(s -> s.zk.getSessionId()).toArray();
  }

  private static ZooKeeper connect(String connect, int timeoutMs) {
    CountDownLatch connected = new CountDownLatch(1);
    ZooKeeper zk;
    try {
      zk = new ZooKeeper(connect, Math.max(timeoutMs, 4000), event -> {
        if (event.getState() == Watcher.Event.KeeperState.SyncConnected) {
          connected.countDown();
        }
      });
    } catch (IOException e) {
      throw new RaylogReadException(RaylogReadException.ZOOKEEPER_UNAVAILABLE,
          "cannot reach ZooKeeper at " + connect + ": " + e, null, e);
    }
    boolean ok;
    try {
      ok = connected.await(timeoutMs, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      ok = false;
    }
    if (!ok) {
      closeQuietly(zk);
      throw new RaylogReadException(RaylogReadException.ZOOKEEPER_UNAVAILABLE,
          "no ZooKeeper session with " + connect + " within " + timeoutMs + " ms; check the option "
              + "'zookeeper' (host:port of the raylog cluster's ZooKeeper)");
    }
    return zk;
  }

  /** Guarded by the class lock. */
  private static void startReaper() {
    if (reaper != null) {
      return;
    }
    reaper = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "raylog-zk-sessions");
      t.setDaemon(true);
      return t;
    });
    reaper.scheduleWithFixedDelay(ZkSessions::closeIdle, IDLE_MS / 2, IDLE_MS / 2, TimeUnit.MILLISECONDS);
    Runtime.getRuntime().addShutdownHook(new Thread(ZkSessions::closeEverything, "raylog-zk-sessions-close"));
  }

  /** Close the sessions unused for {@link #IDLE_MS} (and dead ones nobody holds). */
  static void closeIdle() {
    long now = System.currentTimeMillis();
    List<Session> idle = new ArrayList<>();
    synchronized (ZkSessions.class) {
      OPEN.values().removeIf(s -> {
        boolean gone = s.holders == 0 && (now - s.idleSince >= IDLE_MS || !s.zk.getState().isAlive());
        if (gone) {
          idle.add(s);
        }
        return gone;
      });
    }
    closeAll(idle);
  }

  /** Close every session nobody holds now (the held ones close when released and idle). */
  static void closeUnheld() {
    List<Session> unheld = new ArrayList<>();
    synchronized (ZkSessions.class) {
      OPEN.values().removeIf(s -> {
        if (s.holders == 0) {
          unheld.add(s);
        }
        return s.holders == 0;
      });
    }
    closeAll(unheld);
  }

  private static void closeEverything() {
    List<Session> all;
    synchronized (ZkSessions.class) {
      all = new ArrayList<>(OPEN.values());
      OPEN.clear();
    }
    closeAll(all);
  }

  private static void closeAll(List<Session> sessions) {
    for (Session s : sessions) {
      closeQuietly(s.zk);
    }
  }

  private static void closeQuietly(ZooKeeper zk) {
    try {
      zk.close();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
